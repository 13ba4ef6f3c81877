"""Collectives in the step-time estimate (tpuprof.analyses.collectives) on a real sharded compile: a shard_map
program on v5p:4x4x4 (64 chips) whose collectives are written out (all-gather, all-reduce, reduce-scatter,
all-to-all, collective-permute, and an all-reduce in a loop of known trip count), compiled once per session.
The expected bytes come from the program's own shapes below, not from the parser."""

from __future__ import annotations

import math

import pytest

from tpuprof import documents_preflight, targets
from tpuprof.analyses import collectives, step_estimate
from tpuprof.models.preflight import TargetEstimate

FSDP, TENSOR = 16, 4  # mesh over the 64 chips of v5p:4x4x4
B, E, M = 256, 1024, 2048  # global shapes
BIG = 512  # rows of the independent matmul each device runs while the permute is in flight
TRIPS = 5
BF16 = 2


@pytest.fixture(scope="session")
def sharded(tmp_path_factory):
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    from tpuprof.sources import tpu_compile

    devices = np.array(tpu_compile.topology_devices("v5p:4x4x4"))
    mesh = Mesh(devices.reshape(FSDP, TENSOR), ("fsdp", "tensor"))

    def body(x, w, v, big):
        full = jax.lax.all_gather(w, "fsdp", tiled=True)  # w: [E/16, M/4] -> [E, M/4]
        h = x @ full  # [B/16, M/4]
        summed = jax.lax.psum(h, "tensor")
        scattered = jax.lax.psum_scatter(v, "tensor", scatter_dimension=0, tiled=True)  # v: [M, M/4]
        shifted = jax.lax.ppermute(x, "fsdp", [(i, (i + 1) % FSDP) for i in range(FSDP)])
        exchanged = jax.lax.all_to_all(h, "tensor", 0, 0, tiled=True)
        busy = jnp.tanh(big @ big.T) @ big  # independent of the permute: the scheduler overlaps them
        looped = jax.lax.fori_loop(0, TRIPS, lambda i, c: jnp.tanh(jax.lax.psum(c, "fsdp")), x[:8])
        return summed, scattered, shifted + busy[:shifted.shape[0], :E], exchanged, looped

    step = jax.shard_map(body, mesh=mesh, check_vma=False,
                         in_specs=(P("fsdp", None), P("fsdp", "tensor"), P(None, "tensor"), P("fsdp", None)),
                         out_specs=(P("fsdp", "tensor"), P("fsdp", "tensor"), P("fsdp", None), P("fsdp", "tensor"),
                                    P("fsdp", None)))
    bf16 = jnp.bfloat16
    args = [jax.ShapeDtypeStruct(shape, bf16, sharding=NamedSharding(mesh, spec)) for shape, spec in (
        ((B, E), P("fsdp", None)), ((E, M), P("fsdp", "tensor")), ((M, M), P(None, "tensor")),
        ((FSDP * BIG, 4096), P("fsdp", None)))]
    folder = tmp_path_factory.mktemp("sharded") / "dump"
    jax.jit(step).lower(*args).compile({"xla_dump_to": str(folder), "xla_dump_hlo_as_proto": True,
                                               "xla_dump_hlo_as_text": True})
    cost = step_estimate.load(folder)
    return cost, step_estimate.estimate(cost, "v5p")


def by_kind(estimate, kind):
    return [op for op in estimate.communication.ops if op.kind == kind]


def test_every_collective_of_the_program_is_found_with_its_bytes_and_group(sharded):
    cost, estimate = sharded
    assert cost.torus.bounds == (4, 4, 4) and len(cost.torus.assignment) == 64
    (gather,) = by_kind(estimate, "all-gather")
    assert (gather.bytes, gather.group_size) == (E * (M // TENSOR) * BF16, FSDP)  # the gathered weight
    (scatter,) = by_kind(estimate, "reduce-scatter")
    assert (scatter.bytes, scatter.group_size) == (M * (M // TENSOR) * BF16, TENSOR)  # its input
    (exchange,) = by_kind(estimate, "all-to-all")
    assert (exchange.bytes, exchange.group_size) == ((B // FSDP) * (M // TENSOR) * BF16, TENSOR)
    (permute,) = by_kind(estimate, "collective-permute")
    assert permute.bytes == (B // FSDP) * E * BF16
    reduces = sorted(by_kind(estimate, "all-reduce"), key=lambda op: op.count)
    assert [(op.bytes, op.group_size, op.count) for op in reduces] == [
        ((B // FSDP) * (M // TENSOR) * BF16, TENSOR, 1), (8 * E * BF16, FSDP, TRIPS)]  # psum; the loop's
    assert estimate.collective_s == pytest.approx(sum(op.seconds * op.count for op in estimate.communication.ops))
    # The collectives are timed by the collective model, not as HBM traffic of the compute estimate.
    assert not {t.op.opcode for t in estimate.ops} & (collectives.SYNC | set(collectives.STARTS))


def test_an_async_permute_is_hidden_by_the_compute_scheduled_inside_it(sharded):
    _, estimate = sharded
    (permute,) = by_kind(estimate, "collective-permute")
    assert permute.asynchronous and permute.seconds > 0
    assert permute.exposed_seconds < permute.seconds
    sync = [op for op in estimate.communication.ops if not op.asynchronous]
    assert sync and all(op.exposed_seconds == pytest.approx(op.seconds * op.count) for op in sync)
    assert 0 < estimate.exposed_collective_s < estimate.collective_s
    # The step adds the exposed part; the band's high end all of it.
    assert estimate.point_s == pytest.approx(estimate.compute_point_s + estimate.exposed_collective_s)
    assert estimate.high_s == pytest.approx(estimate.compute_high_s + estimate.collective_s)


def test_report_carries_the_collective_figures(sharded):
    _, estimate = sharded
    out = documents_preflight.estimate(TargetEstimate(estimate, B // FSDP // TENSOR, tokens_per_example=E))
    assert out["collective_ms"] == pytest.approx(estimate.collective_s * 1e3, abs=1e-4)
    assert out["exposed_collective_ms"] < out["collective_ms"]
    assert out["tokens_per_s_per_chip"] == out["tokens_per_s"] > 0
    assert out["top_collectives"] and "4x4x4 chips, wraparound on x,y,z" in out["collectives_method"]
    assert out["mfu_source"].startswith("the compiled program's FLOPs")  # no model given


def test_multi_slice_adds_the_dcn_all_reduce(sharded):
    cost, one = sharded
    gradient = 64e6
    two = step_estimate.estimate(cost, "v5p", num_slices=2, gradient_bytes_per_device=gradient)
    # v5p: 50 Gbit/s of DCN per chip; a ring over 2 slices moves 2 x (2-1)/2 x the bytes.
    assert two.dcn_s == pytest.approx(gradient / (50e9 / 8))
    assert two.point_s == pytest.approx(one.point_s + two.dcn_s)
    unknown = step_estimate.estimate(cost, "v5p", num_slices=2)
    assert unknown.dcn_s is None
    assert any("across 2 slices" in line for line in documents_preflight.not_modelled(unknown))


@pytest.fixture(scope="session")
def sparsecore_all_reduce(tmp_path_factory):
    """A psum of a replicated [2048, 4096] bf16 weight over the 16 devices of tpu7x:2x2x2, compiled as libtpu
    does by default: it runs the all-reduce on the SparseCores, an async-start whose computation calls the
    all-reduce's own."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    from tpuprof.sources import tpu_compile

    devices = np.array(tpu_compile.topology_devices("tpu7x:2x2x2"))
    mesh = Mesh(devices.reshape(-1), ("d",))
    step = jax.shard_map(lambda x, w: x @ jax.lax.psum(w, "d"), mesh=mesh, check_vma=False,
                         in_specs=(P("d", None), P(None, None)), out_specs=P("d", None))
    args = [jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=NamedSharding(mesh, spec))
            for shape, spec in (((1024, 2048), P("d", None)), ((2048, 4096), P(None, None)))]
    folder = tmp_path_factory.mktemp("sparsecore") / "dump"
    jax.jit(step).lower(*args).compile({"xla_dump_to": str(folder), "xla_dump_hlo_as_proto": True,
                                        "xla_dump_hlo_as_text": True})
    return folder, len(devices.ravel())


def test_an_all_reduce_on_the_sparsecores_is_timed_as_a_collective(sparsecore_all_reduce):
    folder, devices = sparsecore_all_reduce
    text = next(folder.glob("*.after_optimizations.txt")).read_text()
    assert 'async_execution_thread="sparsecore"' in text  # the form this test is about, as libtpu writes it
    cost = step_estimate.load(folder)
    estimate = step_estimate.estimate(cost, "tpu7x")
    (reduce,) = estimate.communication.ops
    assert (reduce.kind, reduce.bytes, reduce.group_size) == ("all-reduce", 2048 * 4096 * BF16, devices)
    assert reduce.asynchronous and reduce.seconds > 0
    # Timed by the collective model, not as HBM traffic of the compute estimate.
    assert not [t for t in estimate.ops if t.op.name == reduce.name]
    # libtpu's token-only bookkeeping of the async call (PrepareAsyncCallStart/Done) is no kernel to estimate.
    assert "PrepareAsyncCallDone" in text and not estimate.kernels_without_estimate, estimate.kernels_without_estimate


LAYERS, WIDTH = 4, 1024  # the FSDP program: a scan over 4 [1024, 1024] bf16 layers on v5p:2x2x1


@pytest.fixture(scope="session")
def fsdp_async(tmp_path_factory):
    """A training step (grad of a scan of matmuls) with its layers' weights sharded over the 4 chips of
    v5p:2x2x1, compiled with the flags the published recipes set (llm.COMPILER_OPTIONS, MaxText's). libtpu
    gathers the weights (one sync all-gather in the forward loop, one async in the backward, held by its start
    fusion, an async collective fusion and its done fusion) and reduce-scatters each layer's gradient as an
    `all-reduce-scatter` fusion (an all-reduce its computation dynamic-slices to this device's part).
    A 2 s compile."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    from tpuprof.sources import llm, tpu_compile

    devices = np.array(tpu_compile.topology_devices("v5p:2x2x1"))
    mesh = Mesh(devices.reshape(-1), ("fsdp",))

    def loss(weights, x):
        h, _ = jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, weights)
        return jnp.mean(h.astype(jnp.float32) ** 2)

    weights = NamedSharding(mesh, P(None, "fsdp", None))
    args = [jax.ShapeDtypeStruct((LAYERS, WIDTH, WIDTH), jnp.bfloat16, sharding=weights),
            jax.ShapeDtypeStruct((64 * devices.size, WIDTH), jnp.bfloat16, sharding=NamedSharding(mesh, P("fsdp")))]
    folder = tmp_path_factory.mktemp("fsdp_async") / "dump"
    options = dict(llm.COMPILER_OPTIONS, xla_dump_to=str(folder), xla_dump_hlo_as_proto=True,
                   xla_dump_hlo_as_text=True)
    step = jax.jit(lambda w, x: w - 0.1 * jax.grad(loss)(w, x), out_shardings=weights)
    step.lower(*args).compile(options)
    cost = step_estimate.load(folder)
    return cost, step_estimate.estimate(cost, "v5p"), next(folder.glob("*after_optimizations.txt")).read_text()


@pytest.mark.compile
def test_each_collective_of_an_async_collective_fusion_is_timed_once(fsdp_async):
    import re

    _, estimate, text = fsdp_async
    # The forms this test is about, as libtpu writes them.
    assert 'custom_call_target="AsyncCollectiveStart"' in text and "%async_collective_fusion" in text
    assert "%all-reduce-scatter" in text
    # The program's collectives, one per channel id (the fusions that carry one collective hold clones of it).
    channels = set(re.findall(r"= \S+ (?:all-gather|all-reduce|reduce-scatter|all-to-all|collective-permute)"
                              r"(?:-start)?\(.*?channel_id=(\d+)", text))
    assert len(channels) == 3
    ops = estimate.communication.ops
    assert len(ops) == len(channels)
    gathers = sorted(by_kind(estimate, "all-gather"), key=lambda op: op.asynchronous)
    assert [(op.asynchronous, op.bytes, op.count) for op in gathers] == [
        (False, WIDTH * WIDTH * BF16, LAYERS), (True, WIDTH * WIDTH * BF16, LAYERS)]
    # The async one is hidden in part by the matmul fused with it; the sync one is not.
    sync, hidden = gathers
    assert sync.exposed_seconds == pytest.approx(sync.seconds * LAYERS)
    assert hidden.exposed_seconds < hidden.seconds * LAYERS
    assert estimate.collective_s == pytest.approx(sum(op.seconds * op.count for op in ops))


@pytest.mark.compile
def test_the_start_and_done_fusions_of_an_async_collective_are_not_compute(fsdp_async):
    """They alias their buffers (output_to_operand_aliasing) and move nothing the collective model does not
    time: counting their operands as HBM traffic would pay for the gather a second time."""
    _, estimate, text = fsdp_async
    assert "%async-collective-start = " in text and "%async-collective-done = " in text
    assert not [t.op.name for t in estimate.ops if t.op.name.startswith("async-collective-")]
    # The async collective fusion between them is the matmul that hides the gather: compute.
    assert [t.op.name for t in estimate.ops if t.op.opcode == "fusion" and t.op.flops > 0 and t.op.name in text
            and f"%{t.op.name} = " in text and "async_collective_fusion" in
            text.split(f"%{t.op.name} = ", 1)[1].split("\n", 1)[0]]


@pytest.mark.compile
def test_an_all_reduce_scatter_fusion_is_timed_as_a_reduce_scatter(fsdp_async):
    cost, estimate, _ = fsdp_async
    (scatter,) = by_kind(estimate, "reduce-scatter")
    assert not by_kind(estimate, "all-reduce")
    # Each layer's [1024, 1024] gradient, summed over the 4 chips (x and y of a 2x2 without wraparound: one
    # link each way on each axis), each chip keeping a quarter: (n-1)/n of the input once, not twice.
    volume = WIDTH * WIDTH * BF16
    assert (scatter.bytes, scatter.group_size, scatter.count) == (volume, 4, LAYERS)
    link = targets.get("v5p").ici_link_gbps * 1e9 / targets.get("v5p").devices_per_chip
    assert cost.torus.bounds == (2, 2, 1) and not any(cost.torus.wrap)
    assert scatter.seconds == pytest.approx(3 / 4 * volume / (2 * link))


def test_device_ids_number_chips_row_major_as_libtpu_does():
    pytest.importorskip("jax")
    from tpuprof.sources import tpu_compile

    for name, generation in (("v5p:4x4x4", "v5p"), ("tpu7x:2x2x2", "tpu7x"), ("v6e:4x4", "v6e")):
        devices = tpu_compile.topology_devices(name)
        bounds = tuple(int(b) for b in (name.split(":")[1].split("x") + ["1"])[:3])
        torus = collectives.Torus(bounds, (False,) * 3, targets.get(generation).devices_per_chip, [], 1.0)
        for device in devices:
            assert torus.chip_of(device.id) == tuple((list(device.coords) + [0])[:3]), (name, device.id)


def test_replica_group_forms():
    from tpuprof.protos import hlo_pb2

    assert collectives.iota_groups(32, 8, [256], []) == [list(range(g * 8, g * 8 + 8)) for g in range(32)]
    transposed = collectives.iota_groups(8, 32, [32, 8], [1, 0])  # [8,32]<=[32,8]T(1,0)
    assert transposed[0] == list(range(0, 256, 8)) and transposed[7] == list(range(7, 256, 8))
    instruction = hlo_pb2().HloInstructionProto()
    for group in ([0, 1], [2, 3]):
        instruction.replica_groups.add().replica_ids.extend(group)
    assert collectives.replica_groups(instruction, 4) == [[0, 1], [2, 3]]
    assert collectives.replica_groups(hlo_pb2().HloInstructionProto(), 4) == [[0, 1, 2, 3]]
    mesh = hlo_pb2().HloInstructionProto()  # mesh['a'=4,'b'=2] {'a'}: vary a, fix b
    for axis, size in (("a", 4), ("b", 2)):
        added = mesh.mesh_axes_replica_group_list.mesh.axes.add()
        added.name, added.size = axis, size
    mesh.mesh_axes_replica_group_list.axes.add().mesh_axis_index = 0
    assert collectives.replica_groups(mesh, 8) == [[0, 2, 4, 6], [1, 3, 5, 7]]


def test_ring_and_torus_formulas():
    link = 100e9
    ring = collectives.Torus((16, 1, 1), (True, False, False), 1, [], link)
    line = collectives.Torus((16, 1, 1), (False, False, False), 1, [], link)
    group = [list(range(16))]
    volume = 16e6
    seconds, n, _ = collectives.time_collective("all-gather", volume, group, [], ring)
    assert (n, seconds) == (16, pytest.approx(15 / 16 * volume / (2 * link)))  # both directions of a ring
    assert collectives.time_collective("all-gather", volume, group, [], line)[0] == pytest.approx(2 * seconds)
    assert collectives.time_collective("all-reduce", volume, group, [], ring)[0] == pytest.approx(2 * seconds)
    # all-to-all on a ring of n: n V / 4 bytes cross a cut of 2 links per direction.
    assert collectives.time_collective("all-to-all", volume, group, [], ring)[0] == pytest.approx(16 * volume / 8 / link)
    # permute: one hop for neighbours, the wrap link makes 15 -> 0 a neighbour on the ring only.
    pairs = [(i, (i + 1) % 16) for i in range(16)]
    assert collectives.time_collective("collective-permute", volume, [], pairs, ring)[0] == pytest.approx(volume / link)
    assert collectives.time_collective("collective-permute", volume, [], pairs, line)[0] == pytest.approx(15 * volume / link)
    # Two axes: the bandwidths add.
    square = collectives.Torus((4, 4, 4), (True,) * 3, 1, [], link)
    plane = [list(range(16))]  # x and y of z=0
    assert collectives.time_collective("all-gather", volume, plane, [], square)[0] == pytest.approx(
        15 / 16 * volume / (4 * link))


def test_wraparound_follows_the_published_topologies():
    v5p, v6e = targets.get("v5p"), targets.get("v6e")
    assert collectives.published_wrap(v5p, (4, 4, 4)) == (True, True, True)
    assert collectives.published_wrap(v5p, (2, 4, 4)) == (False, False, False)  # not a whole cube
    assert collectives.published_wrap(v6e, (16, 16, 1)) == (True, True, False)
    assert collectives.published_wrap(v6e, (8, 16, 1)) == (False, True, False)
    assert all(t.ici_link_gbps and t.ici_source.startswith("https://") for t in
               (targets.get(g) for g in ("v4", "v5e", "v5p", "v6e", "tpu7x")))


def test_slices_rank_by_cost_and_by_time():
    def result(name, chips, examples_per_s, cost):
        return {"target": name.split("-")[0], "slice": {"name": name, "chips": chips}, "fits": True,
                "batch_size": 8, "estimate": {"examples_per_s": examples_per_s, "step_ms": 1.0,
                                              "cost_per_million_tokens": cost, "price_verified": False}}

    results = [result("v5p-128", 64, 10.0, 3.0), result("v6e-256", 256, 4.0, 2.0),
               result("tpu7x-64", 32, 30.0, None), {"target": "v5e", "fits": False}]
    ranked = documents_preflight.ranking(results)
    assert [r["slice"]["name"] for r in ranked["by_cost"]] == ["v6e-256", "v5p-128"]  # tpu7x: no price
    # by time: the whole slice's throughput, 256 x 4 > 32 x 30 > 64 x 10
    assert [r["slice"]["name"] for r in ranked["by_time"]] == ["v6e-256", "tpu7x-64", "v5p-128"]
    cheapest, fastest = documents_preflight.choice(results).splitlines()
    assert cheapest.startswith("cheapest that fits: v6e-256") and "by cost: v6e-256 $2.00 < v5p-128 $3.00" in cheapest
    assert fastest.startswith("fastest: v6e-256") and "v6e-256 1,024/s > tpu7x-64 960/s > v5p-128 640/s" in fastest
    # Throughput per chip beside the batch, which is per device (two a chip on TPU7x): each says which.
    assert "per chip" in fastest and "at batch 8 per device" in fastest and "at batch 8 per device" in cheapest


def test_llm_model_flops_follow_maxtext():
    # 6 x N x tokens + 12 x layers x tokens x seq x width / 2 (causal)
    assert step_estimate.model_flops(8e9, 4096, layers=32, seq_len=4096, attention_width=4096) == pytest.approx(
        6 * 8e9 * 4096 + 6 * 32 * 4096 * 4096 * 4096)
    assert math.isclose(step_estimate.model_flops(1e9, 10), 6e10)


def test_mfu_of_a_known_model_uses_maxtext_flops_per_device():
    from tpuprof.analyses import preflight

    model = {"parameters": 8e9, "layers": 32, "heads": 32, "head_dim": 128}
    tokens = 4 / 2 * 4096  # per device: the chip's batch shared by its 2 devices
    assert preflight.model_flops_per_device(model, 4096, 4, devices_per_chip=2) == pytest.approx(
        6 * 8e9 * tokens + 12 * 32 * tokens * 4096 * 4096 / 2)
    assert preflight.model_flops_per_device(None, 4096, 4) is None  # no model
