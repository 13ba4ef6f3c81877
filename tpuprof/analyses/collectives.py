"""The communication of a compiled SPMD step: every collective of the schedule, timed on the slice's ICI torus,
and how much of it the compute scheduled next to it hides.

Read from the module libtpu compiled and the dump's `*.target_arguments.txt` (the slice's chip bounds: chips
per host x hosts, and its wrap flags) and `*.execution_options.txt` (the device assignment: which device each
partition runs on). Device ids number chips row-major, x fastest, with the TensorCores of a chip adjacent
(TPU7x: ids 2c and 2c+1 are chip c); tests/test_collectives.py checks this against jax's topology devices.

Each collective (all-gather, reduce-scatter, all-reduce, all-to-all, collective-permute; sync, `-start`/`-done`,
`async-start` wrapping one, or a fusion holding one) is timed once, and takes, with V its bytes per device, n the
devices of its replica group, W a link's bandwidth per direction (tpuprof.targets.ICI) and d the devices sharing
a chip's links:
- all-gather (V = the gathered result), reduce-scatter (V = the input): (n-1)/n x V / B, where B = the sum over
  the torus axes the group spans of W x 2 when the group covers a wrapped axis (a bidirectional ring) else
  W x 1 (a line: its end chips have one link), divided by d;
- all-reduce: reduce-scatter + all-gather, 2 (n-1)/n x V / B;
- all-to-all: bisection-limited: n V / 4 bytes cross the cut through the group's longest axis in each
  direction, over (chips in the group / that axis' length) x (2 if wrapped else 1) links of W / d;
- collective-permute: V x the longest hop of its source->target pairs / (W / d) (one hop for neighbours).
Loops multiply by their trip counts. Latency per hop and per step, congestion between concurrent collectives,
and the compiler's own collective algorithms (e.g. its decomposition of all-gathers into permutes, which the
schedule then shows as permutes) are not modelled beyond what the schedule shows.

libtpu writes two collectives in forms of its own. Its async collective fusion (MaxText's flags turn it on) holds
one collective in several fusions, each with a clone of it under the same channel id: a start fusion (root
custom-call AsyncCollectiveStart), zero or more `async_collective_fusion`s (compute scheduled while the transfer
runs) and a done fusion (AsyncCollectiveDone); the collective is the start/done pair, the fusions between are
compute. Its `all-reduce-scatter` fusions hold an all-reduce their computation dynamic-slices to this device's
part: a reduce-scatter (V = the all-reduce's input), as XLA's own reduce-scatter matching reads that pattern.

Overlap: the schedule is walked in order; an async collective starts a transfer at its `-start` (or start
fusion); every op scheduled before its `-done` drains in-flight transfers (first in, first out) by its own
estimated time; what is left at the `-done` is exposed. Sync collectives are fully exposed. A fusion that holds
a collective of its own next to compute runs the transfer behind that compute: the part that outlasts the
fusion's estimated compute time is exposed. A while loop counts as compute of its trip count x its body's time
for transfers in flight around it.

Host transfers ride the same walk on links of their own: the copies a remat policy's host offload schedules
between HBM and the host's memory (S(5)) (host_transfer_in) take their bytes / the host link's bandwidth per
device, in a first-in-first-out queue per direction (the link is full duplex) that compute drains as it drains
the ICI's; what is left at a copy's done is exposed. Waiting at one link's done lets the other links run.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from tpuprof import targets
from tpuprof.models import shape as shapes
from tpuprof.models.hlo_module import HloModule
from tpuprof.models.shape import HOST_MEMORY_SPACE

KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute", "ragged-all-to-all")
SYNC = set(KINDS)
STARTS = {"all-gather-start": "all-gather", "all-reduce-start": "all-reduce",
          "collective-permute-start": "collective-permute"}
DONES = {"all-gather-done", "all-reduce-done", "collective-permute-done", "async-done"}
ASYNC_COLLECTIVE_ROLES = {"AsyncCollectiveStart": "start", "AsyncCollectiveDone": "done"}
TO_HOST, FROM_HOST = "to host", "from host"


@dataclass
class Torus:
    """The slice's chips and links as the compile saw them."""

    bounds: tuple[int, int, int]  # chips per axis (x, y, z)
    wrap: tuple[bool, bool, bool]
    devices_per_chip: int
    assignment: list[int]  # partition (logical id) -> device id
    link_bytes_per_s: float

    def chip_of(self, logical: int) -> tuple[int, int, int]:
        device = self.assignment[logical] if logical < len(self.assignment) else logical
        chip = device // self.devices_per_chip
        x, y = self.bounds[0], self.bounds[1]
        return chip % x, (chip // x) % y, chip // (x * y)

    @property
    def chips(self) -> int:
        return math.prod(self.bounds)


def compiled_torus(arguments, assignment: list[int], target: targets.Target) -> Torus | None:
    """The torus a module was compiled for, from its dump's target arguments (hlo_dump.TargetArguments) and device
    assignment; None when they do not say, or the generation has no published ICI figure."""
    if not target.ici_link_gbps or arguments is None:
        return None
    per_host, hosts = arguments.chips_per_host_bounds, arguments.host_bounds
    if per_host is None or hosts is None:
        return None
    bounds = tuple(a * b for a, b in zip(per_host, hosts))
    wrap = tuple(a or b for a, b in zip(arguments.wrap, published_wrap(target, bounds)))
    return Torus(bounds, wrap, max(target.devices_per_chip, 1), list(assignment), target.ici_link_gbps * 1e9)


def slice_torus(topology: str, target: targets.Target) -> Torus | None:
    """The torus of a whole slice (`v5p:4x4x4`), devices numbered as libtpu numbers them: for collectives a
    one-device compile does not hold (data parallelism across the slice)."""
    if not target.ici_link_gbps:
        return None
    dims = [int(d) for d in re.findall(r"\d+", topology.partition(":")[2])]
    bounds = tuple((dims + [1, 1, 1])[:3])
    return Torus(bounds, published_wrap(target, bounds), max(target.devices_per_chip, 1), [],
                 target.ici_link_gbps * 1e9)


def data_parallel_all_reduce(gradient_bytes: float, torus: Torus) -> Collective:
    """The gradient all-reduce over every device of the slice that a one-device (replica) compile leaves out;
    counted exposed (XLA overlaps part of it with the backward pass; not modelled)."""
    devices = torus.chips * torus.devices_per_chip
    seconds, n, axes = time_collective("all-reduce", gradient_bytes, [list(range(devices))], [], torus)
    return Collective("data-parallel gradient all-reduce", "all-reduce", "", "not in the one-device compile: "
                      "data parallelism over the slice", False, gradient_bytes, n, axes, seconds, 1, seconds)


def published_wrap(target: targets.Target, bounds) -> tuple[bool, bool, bool]:
    """Which axes are rings (tpuprof.targets.ICI): whole 4x4x4 cubes on v4/v5p/TPU7x, a full 16 on v5e/v6e."""
    if target.ici_wraparound == "cube":
        cube = all(b % 4 == 0 for b in bounds)
        return tuple(cube and b > 2 for b in bounds)
    if target.ici_wraparound == "16":
        return tuple(b == 16 for b in bounds)
    return (False, False, False)


# --- replica groups ------------------------------------------------------------------------------------

def replica_groups(instruction, devices: int) -> list[list[int]]:
    """The groups of partitions a collective runs over, in any of the proto's forms: explicit
    `{{0,1},{2,3}}`, iota `[32,8]<=[256]` / `[8,32]<=[32,8]T(1,0)`, mesh axes `mesh[...] {'axis_0'}`; none
    given = one group of every device."""
    explicit = [list(g.replica_ids) for g in instruction.replica_groups]
    if explicit:
        return explicit
    listed = instruction.collective_device_list
    if listed.replica_groups:
        return [list(g.replica_ids) for g in listed.replica_groups]
    for iota in (instruction.iota_collective_device_list, listed.iota_replica_group_list):
        if iota.num_replica_groups:
            return iota_groups(iota.num_replica_groups, iota.num_devices_per_group,
                               list(iota.iota_reshape_dims), list(iota.iota_transpose_perm))
    mesh_groups = instruction.mesh_axes_replica_group_list
    if mesh_groups.mesh.axes:
        return mesh_axes_groups(mesh_groups)
    return [list(range(devices))]


def iota_groups(groups: int, per_group: int, reshape: list[int], perm: list[int]) -> list[list[int]]:
    """XLA's IotaReplicaGroupList: iota(prod(reshape)) reshaped, transposed by perm, cut into groups."""
    import numpy as np

    reshape = reshape or [groups * per_group]
    ids = np.arange(math.prod(reshape)).reshape(reshape)
    if perm:
        ids = ids.transpose(perm)
    return ids.reshape(groups, per_group).tolist()


def mesh_axes_groups(proto) -> list[list[int]]:
    """Groups that vary along the listed mesh axes (sub-axes: pre_size x size of one axis) and are fixed on
    the others; the mesh's device ids, or iota when it lists none."""
    import numpy as np

    sizes = [a.size for a in proto.mesh.axes]
    total = math.prod(sizes)
    ids = np.array(list(proto.mesh.device_ids) or range(total)).reshape(sizes)
    # Split sub-axes into axes of their own: axis i of size s, sub-axis (pre, size) -> [s/(pre*size), size, pre].
    split_sizes, chosen = [], []
    for index, size in enumerate(sizes):
        subs = [a for a in proto.axes if a.mesh_axis_index == index]
        sub = next((a.sub_axis_info for a in subs if a.HasField("sub_axis_info")), None)
        if sub is not None and sub.size:
            pre, part = max(sub.pre_size, 1), sub.size
            split_sizes += [size // (pre * part), part, pre]
            chosen.append(len(split_sizes) - 2)
        else:
            split_sizes.append(size)
            if subs:
                chosen.append(len(split_sizes) - 1)
    ids = ids.reshape(split_sizes)
    rest = [a for a in range(len(split_sizes)) if a not in chosen]
    per_group = math.prod(split_sizes[a] for a in chosen) if chosen else 1
    return ids.transpose(rest + chosen).reshape(-1, per_group).tolist()


# --- timing one collective ----------------------------------------------------------------------------

@dataclass
class Collective:
    name: str
    kind: str  # all-gather ... collective-permute
    computation: str
    op_name: str
    asynchronous: bool
    bytes: float  # V per device (see the module docstring)
    group_size: int
    axes: str  # the torus axes the group spans, e.g. "x,y (ring)"
    seconds: float  # one execution
    count: int = 1
    exposed_seconds: float = 0.0  # per step (times count)

    def to_json(self) -> dict:
        return {"name": self.name, "kind": self.kind, "op_name": self.op_name, "async": self.asynchronous,
                "bytes": int(self.bytes), "group_size": self.group_size, "axes": self.axes, "count": self.count,
                "ms": round(self.seconds * self.count * 1e3, 4),
                "exposed_ms": round(self.exposed_seconds * 1e3, 4)}


def time_collective(kind: str, volume: float, groups: list[list[int]], pairs: list[tuple[int, int]],
                    torus: Torus) -> tuple[float, int, str]:
    """(seconds, group size, axes) of one execution, by the ring/torus formulas of the module docstring."""
    link = torus.link_bytes_per_s / torus.devices_per_chip
    if kind == "collective-permute":
        hops = max((_hops(torus.chip_of(a), torus.chip_of(b), torus) for a, b in pairs), default=0)
        return (volume * hops / link if hops else 0.0), 2, f"{hops} hop(s)"
    group = max(groups, key=len) if groups else []
    n = len(group)
    chips = {torus.chip_of(d) for d in group}
    if n <= 1 or len(chips) <= 1:
        return 0.0, n, "one chip"
    spans = [len({c[axis] for c in chips}) for axis in range(3)]
    spanned = [axis for axis in range(3) if spans[axis] > 1]
    rings = [axis for axis in spanned if torus.wrap[axis] and spans[axis] == torus.bounds[axis]]
    axes = ",".join("xyz"[a] + ("(ring)" if a in rings else "") for a in spanned)
    if kind in ("all-to-all", "ragged-all-to-all"):
        longest = max(spanned, key=lambda a: spans[a])
        links = len(chips) / spans[longest] * (2 if longest in rings else 1)
        return n * volume / 4 / (links * link), n, axes
    bandwidth = sum(link * (2 if axis in rings else 1) for axis in spanned)
    one_pass = (n - 1) / n * volume / bandwidth
    return (2 * one_pass if kind == "all-reduce" else one_pass), n, axes


def _hops(a, b, torus: Torus) -> int:
    total = 0
    for axis in range(3):
        distance = abs(a[axis] - b[axis])
        if torus.wrap[axis]:
            distance = min(distance, torus.bounds[axis] - distance)
        total += distance
    return total


# --- the schedule walk --------------------------------------------------------------------------------

@dataclass
class HostTransfer:
    """One asynchronous copy between HBM and the host's memory (an offloaded activation going out or coming back)."""

    name: str
    direction: str  # TO_HOST or FROM_HOST
    computation: str
    op_name: str
    bytes: float  # one execution
    seconds: float  # one execution; 0 when the host link's bandwidth is not known
    count: int = 1
    exposed_seconds: float = 0.0  # per step (times count)


@dataclass
class Communication:
    """What a step spends in collectives, and in transfers between HBM and the host, per step."""

    collective_s: float = 0.0
    exposed_s: float = 0.0
    ops: list[Collective] = field(default_factory=list)
    torus: Torus | None = None
    host_transfers: list[HostTransfer] = field(default_factory=list)
    host_s: float = 0.0
    host_exposed_s: float = 0.0
    host_link_bytes_per_s: float | None = None  # per device and direction; None: not published, transfers untimed

    def host_bytes(self, direction: str) -> float:
        """Bytes a step moves in DIRECTION (TO_HOST, FROM_HOST)."""
        return sum(t.bytes * t.count for t in self.host_transfers if t.direction == direction)

    @property
    def host_copies(self) -> int:
        """Copies between HBM and the host per step, both directions."""
        return sum(t.count for t in self.host_transfers)


def communication(module: HloModule, torus: Torus | None, op_seconds: dict[tuple[str, str], float],
                  host_link_bytes_per_s: float | None = None) -> Communication:
    """Walk the compiled schedule from the entry computation. `op_seconds[(computation, instruction)]` is the
    estimated time of one execution of each compute op. Without a torus the collectives are not timed (they take
    no time here) and only the host transfers are; `host_link_bytes_per_s` (per device and direction) times those,
    None leaves them at 0 s with their bytes counted."""
    proto = module.proto
    schedule = {seq_id: list(seq.instruction_ids) for seq_id, seq in proto.schedule.sequences.items()} \
        if proto.HasField("schedule") else {}
    result = Communication(torus=torus, host_link_bytes_per_s=host_link_bytes_per_s)
    devices = (len(torus.assignment) or torus.chips * torus.devices_per_chip) if torus is not None else 1
    entry = module.entry

    def collective_of(instruction):
        return collective_in(instruction, module.computations) if torus is not None else None

    def volume(kind, holder, instruction) -> float:
        operands = [module.by_id[o] for o in holder.operand_ids if o in module.by_id]
        if kind == "all-gather":
            out = module.shape(holder)
            if holder.opcode == "all-gather-start" and out.is_tuple:
                out = out.tuple_shapes[-1]
            return _bytes(out)
        return sum(_bytes(module.shape(o)) for o in operands)

    def time_of(instruction, kind, holder, computation, count):
        pairs = [(p.source, p.target) for p in holder.source_target_pairs]
        moved = volume(kind, holder, instruction)
        seconds, n, axes = time_collective(kind, moved, replica_groups(holder, devices), pairs, torus)
        op = Collective(instruction.name, kind, computation.name, instruction.metadata.op_name,
                        instruction.opcode not in SYNC, moved, n, axes, seconds, count)
        result.ops.append(op)
        result.collective_s += seconds * count
        return op

    open_channels: set[int] = set()  # libtpu async collectives started and not yet done, by channel id

    def walk(computation, count: int, depth: int) -> float:
        """One execution's duration (compute + exposed communication); adds to result per step."""
        if depth > 64:
            return 0.0
        order = schedule.get(computation.id) or [i.id for i in computation.instructions]
        # Transfers in flight, first in first out, one queue per link: the ICI, and the host link's two
        # directions (PCIe is full duplex). Items: [key of its start, Collective or HostTransfer, seconds left].
        queues: dict[str, list[list]] = {"ici": [], TO_HOST: [], FROM_HOST: []}
        in_flight = queues["ici"]
        duration = 0.0

        def drain(seconds: float, only: tuple[str, ...] = ("ici", TO_HOST, FROM_HOST)) -> None:
            for link in only:
                queue, left = queues[link], seconds
                while queue and left > 0:
                    step = min(left, queue[0][2])
                    queue[0][2] -= step
                    left -= step
                    if queue[0][2] <= 0:
                        queue.pop(0)

        def wait_for(link: str, key) -> float | None:
            """Seconds the schedule waits at the done of the transfer started by KEY on LINK (the transfers
            ahead of it finish first); the other links run meanwhile. None: not in flight here."""
            queue = queues[link]
            position = next((k for k, item in enumerate(queue) if item[0] == key), None)
            if position is None:
                return None
            waited = sum(item[2] for item in queue[:position + 1])
            for item in queue[:position + 1]:
                item[1].exposed_seconds += item[2] * count
            del queue[:position + 1]
            drain(waited, tuple(other for other in queues if other != link))
            return waited

        def compute(instruction) -> float:
            return op_seconds.get((computation.name, instruction.name), 0.0)

        def host_link_of(done) -> str | None:
            """The host link whose queue holds the transfer DONE waits for, None if none does."""
            start = done.operand_ids[0] if done.operand_ids else None
            return next((link for link in (TO_HOST, FROM_HOST) if any(item[0] == start for item in queues[link])),
                        None)

        for instruction_id in order:
            instruction = module.by_id.get(instruction_id)
            if instruction is None:
                continue
            opcode = instruction.opcode
            found = collective_of(instruction)
            # libtpu's async collective fusion: one collective held by its start fusion, the async collective
            # fusions scheduled while it is in flight and its done fusion, each with a clone of it (one
            # channel id). It is timed once, at its start; the fusions between are compute that hides it.
            role = async_collective_role(instruction, module.computations) if found else None
            channel = found[1].channel_id if found else 0
            host = host_transfer_in(instruction, module) if opcode in HOST_STARTS else None
            if opcode == "while":
                trips, _ = module.trip_count(instruction)
                body, condition = module.loop_parts(instruction)
                spent = sum(trips * walk(part, count * trips, depth + 1) for part in (body, condition) if part)
                duration += spent
                drain(spent)
            elif opcode in ("call", "conditional"):
                called = module.called(instruction)
                spent = max((walk(c, count, depth + 1) for c in called[:1 if opcode == "call" else None]),
                            default=0.0)
                duration += spent
                drain(spent)
            elif host is not None:
                # The start's own HBM side is compute (op_costs counts it); the host link then carries the bytes.
                spent = compute(instruction)
                duration += spent
                drain(spent)
                direction, moved = host
                seconds = moved / host_link_bytes_per_s if host_link_bytes_per_s else 0.0
                transfer = HostTransfer(instruction.name, direction, computation.name, instruction.metadata.op_name,
                                        moved, seconds, count)
                result.host_transfers.append(transfer)
                result.host_s += seconds * count
                queues[direction].append([instruction.id, transfer, seconds])
            elif opcode in HOST_DONES and (link := host_link_of(instruction)) is not None:
                waited = wait_for(link, instruction.operand_ids[0]) or 0.0
                result.host_exposed_s += waited * count
                duration += waited
            elif found and (opcode in STARTS or opcode == "async-start" or role == "start"):
                op = time_of(instruction, found[0], found[1], computation, count)
                in_flight.append([("channel", channel) if role else instruction.id, op, op.seconds])
                if role:
                    open_channels.add(channel)
            elif opcode in DONES or role == "done":
                start = ("channel", channel) if role else (instruction.operand_ids[0] if instruction.operand_ids
                                                            else None)
                open_channels.discard(channel)
                waited = wait_for("ici", start)
                if waited is not None:
                    result.exposed_s += waited * count
                    duration += waited
            elif found and not (opcode == "fusion" and channel in open_channels):
                # A sync collective is on the critical path whole. A fusion holding one with compute runs it
                # behind that compute: only what outlasts the compute shows.
                op = time_of(instruction, found[0], found[1], computation, count)
                op.asynchronous = opcode == "fusion"
                spent = compute(instruction) if opcode == "fusion" else 0.0
                exposed = max(op.seconds - spent, 0.0)
                op.exposed_seconds += exposed * count
                result.exposed_s += exposed * count
                duration += spent + exposed
                drain(max(spent - op.seconds, 0.0), ("ici",))
                drain(spent + exposed, (TO_HOST, FROM_HOST))
            else:  # compute, and the async collective fusions of a collective in flight
                spent = compute(instruction)
                duration += spent
                drain(spent)
        # Started here, done elsewhere: counted exposed (conservative), the links one after another.
        for link, queue in queues.items():
            for _, op, left in queue:
                op.exposed_seconds += left * count
                if link == "ici":
                    result.exposed_s += left * count
                else:
                    result.host_exposed_s += left * count
                duration += left
        return duration

    walk(entry, 1, 0)
    return result


HOST_STARTS = {"copy-start", "async-start"}
HOST_DONES = {"copy-done", "async-done"}


def host_transfer_in(instruction, module: HloModule) -> tuple[str, float] | None:
    """(direction, bytes of one execution) of an asynchronous copy between HBM and the host's memory, None for
    anything else. libtpu moves offloaded activations with async-start/async-done pairs around a
    dynamic-update-slice of one layer's activation into a host (S(5)) stack (to the host: the update's bytes) or a
    dynamic-slice of one layer's out of it (back: the slice's bytes); XLA's host offloader writes copy-start /
    copy-done whose destination or source is in host memory (the copied array's bytes)."""
    opcode = instruction.opcode
    if opcode == "copy-start" and instruction.operand_ids and instruction.operand_ids[0] in module.by_id:
        out, source = module.shape(instruction), module.shape(module.by_id[instruction.operand_ids[0]])
        destination = out.tuple_shapes[0] if out.is_tuple and out.tuple_shapes else out
        if destination.memory_space == HOST_MEMORY_SPACE and source.memory_space != HOST_MEMORY_SPACE:
            return TO_HOST, _bytes(source)
        if source.memory_space == HOST_MEMORY_SPACE and destination.memory_space != HOST_MEMORY_SPACE:
            return FROM_HOST, _bytes(destination)
        return None
    if opcode != "async-start":
        return None
    for c in instruction.called_computation_ids:
        computation = module.computations.get(c, _NONE)
        root = next((i for i in computation.instructions if i.id == getattr(computation, "root_id", None)), None)
        if root is None:
            continue
        operands = [module.by_id.get(o) for o in root.operand_ids]
        if root.opcode == "dynamic-update-slice" and len(operands) > 1 and operands[1] is not None:
            update = module.shape(operands[1])
            if module.shape(root).memory_space == HOST_MEMORY_SPACE and update.memory_space != HOST_MEMORY_SPACE:
                return TO_HOST, _bytes(update)
        if root.opcode == "dynamic-slice" and operands and operands[0] is not None:
            out = module.shape(root)
            if module.shape(operands[0]).memory_space == HOST_MEMORY_SPACE and out.memory_space != HOST_MEMORY_SPACE:
                return FROM_HOST, _bytes(out)
    return None


def collective_in(instruction, computations: dict, depth: int = 0):
    """(kind, the instruction holding its shapes and groups) of a collective, a start, an async-start wrapping one
    or a fusion holding one; None otherwise. The async computation may hold a call to the collective's own
    computation: TPU7x's libtpu runs all-reduces on its SparseCores that way (async-start on the "sparsecore"
    thread -> call -> all-reduce). An all-reduce whose result the same computation only dynamic-slices to a part
    is a reduce-scatter (libtpu's `all-reduce-scatter` fusions; XLA's reduce-scatter matching reads the same
    pattern): its kind is "reduce-scatter", its holder still the all-reduce (whose operand is the input)."""
    opcode = instruction.opcode
    if opcode in SYNC:
        return opcode, instruction
    if opcode in STARTS:
        return STARTS[opcode], instruction
    if opcode in ("async-start", "fusion") or (opcode == "call" and depth > 0):
        for c in instruction.called_computation_ids:
            computation = computations.get(c, _NONE)
            for inner in computation.instructions:
                if inner.opcode == "all-reduce" and _sliced_to_a_part(inner, computation):
                    return "reduce-scatter", inner
                if inner.opcode in SYNC:
                    return inner.opcode, inner
                if inner.opcode == "call" and depth < 2:
                    found = collective_in(inner, computations, depth + 1)
                    if found:
                        return found
    return None


def async_collective_role(instruction, computations: dict) -> str | None:
    """"start" or "done" for the fusions that begin and end one of libtpu's async collectives (its async
    collective fusion: the called computation's root is custom-call AsyncCollectiveStart / AsyncCollectiveDone
    on the collective), None otherwise. Between them the schedule may hold async collective fusions: compute
    fused with a clone of the same collective (same channel id), which run while the transfer is in flight."""
    if instruction.opcode != "fusion":
        return None
    for c in instruction.called_computation_ids:
        computation = computations.get(c, _NONE)
        root = next((i for i in computation.instructions if i.id == getattr(computation, "root_id", None)), None)
        if root is not None and root.opcode == "custom-call":
            return ASYNC_COLLECTIVE_ROLES.get(root.custom_call_target)
    return None


def _sliced_to_a_part(all_reduce, computation) -> bool:
    """Every use of the all-reduce in its computation (through bitcasts/reshapes) is the sliced operand of a
    dynamic-slice to fewer elements than it has: each device keeps its part of the sum, as a reduce-scatter does."""
    users: dict[int, list] = {}
    for i in computation.instructions:
        for o in i.operand_ids:
            users.setdefault(o, []).append(i)
    full = _elements(all_reduce)
    pending, sliced = [all_reduce], False
    while pending:
        value = pending.pop()
        for user in users.get(value.id, []):
            if user.opcode in ("bitcast", "reshape"):
                pending.append(user)
            elif user.opcode == "dynamic-slice" and user.operand_ids[0] == value.id and _elements(user) < full:
                sliced = True
            else:
                return False
    return sliced


def _elements(instruction) -> int:
    dims = instruction.shape.dimensions
    return math.prod(dims) if not instruction.shape.tuple_shapes else 0


def dcn_all_reduce_seconds(gradient_bytes_per_device: float, num_slices: int, target: targets.Target) -> float | None:
    """Data parallelism across slices: one all-reduce of each device's gradient shard with its peers in the
    other slices over the data-centre network, ring over slices: 2 (s-1)/s x bytes / (DCN per chip / devices
    per chip). None when the generation's DCN bandwidth is not published."""
    if num_slices <= 1:
        return 0.0
    if not target.dcn_gbps_per_chip:
        return None
    per_device = target.dcn_gbps_per_chip * 1e9 / 8 / max(target.devices_per_chip, 1)
    return 2 * (num_slices - 1) / num_slices * gradient_bytes_per_device / per_device


def _bytes(shape: shapes.Shape) -> float:
    if shape.is_tuple:
        return float(sum(_bytes(s) for s in shape.tuple_shapes))
    if shape.dtype in shapes.NON_ARRAY_TYPES:
        return 0.0
    return float(shape.unpadded_bytes())


class _None:
    instructions: list = []


_NONE = _None()
