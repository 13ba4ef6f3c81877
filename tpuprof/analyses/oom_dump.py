"""An OOM report joined with the XLA dump of the same program: the log's allocations matched to the
dump's buffers, and the arguments that scale with the batch."""

from __future__ import annotations

from pathlib import Path

from tpuprof.errors import UserError


def join_dump(report, dump: Path, target: str | None, batch: int | None = None) -> dict:
    """Match the log's allocations to the dump's buffers by shape, largest first.

    A compile that fails for memory still dumps its buffer assignment; the `oom_intermediate_module` is
    the module at the point of failure, preferred over the after-optimizations one when both exist.
    """
    from tpuprof.analyses import memory

    if not dump.exists():
        raise UserError(f"{dump} does not exist.")
    modules = [m for m in memory.dump_memory(dump, None, target) if m.buffers]
    if not modules:
        raise UserError(f"{dump} holds no buffer assignment.")
    module = next((m for m in modules if "oom_intermediate_module" in m.source), modules[0])
    memory.describe(module, module.buffers)  # fills each buffer's shape text
    buffers = sorted(module.buffers, key=lambda b: -b.size_bytes)
    rows = []
    used: set[int] = set()
    for entry in report.allocations:
        if not entry.shape:
            continue
        wanted = entry.shape.replace(" ", "")
        bare = wanted.split("{")[0]  # older logs print layouts the dump may spell differently
        match = next((b for b in buffers if id(b) not in used and b.shape.replace(" ", "") == wanted), None) \
            or next((b for b in buffers if id(b) not in used and b.shape.split("{")[0] == bare), None)
        if match is not None:
            used.add(id(match))
            rows.append(_row(match, entry.index))
    if not rows:  # no listed shapes (a short message): the dump's largest buffers stand in for the list
        rows = [_row(b) for b in buffers[:10]]
    return {"module": module.name, "source": module.source, "argument_bytes": module.argument_bytes,
            "batch_argument_bytes": _batch_arguments(buffers, batch),
            "temp_bytes": module.temp_bytes, "output_bytes": module.output_bytes, "buffers": rows}


def _row(buffer, index: int | None = None) -> dict:
    row = {"instruction": buffer.instruction, "shape": buffer.shape, "size_bytes": buffer.size_bytes,
           "unpadded_bytes": buffer.unpadded_bytes, "allocation_type": buffer.allocation_type,
           "op_name": buffer.op_name, "source_line": buffer.source_line}
    if index is not None:
        row["index"] = index
    return row


def _batch_arguments(buffers, batch: int | None) -> int:
    """Bytes of the parameters whose shape has the batch dimension: inputs, which shrink with the batch.
    Without --batch, the batch is taken to be the leading dimension of most temporary bytes."""
    from tpuprof.models import shape as shapes

    dims_of = {}
    for buffer in buffers:
        try:
            dims_of[id(buffer)] = shapes.parse_shape(buffer.shape).dims if buffer.shape else ()
        except UserError:
            dims_of[id(buffer)] = ()
    if not batch:
        weights: dict[int, int] = {}
        for buffer in buffers:
            dims = dims_of[id(buffer)]
            if buffer.allocation_type == "temp" and dims and dims[0] > 1:  # the batch is the leading dim
                weights[dims[0]] = weights.get(dims[0], 0) + buffer.size_bytes
        temp_total = sum(b.size_bytes for b in buffers if b.allocation_type == "temp")
        if not weights or max(weights.values()) < 0.6 * temp_total:
            return 0
        batch = max(weights, key=lambda d: (weights[d], d))
    return sum(b.size_bytes for b in buffers
               if b.allocation_type == "parameter" and batch in dims_of[id(b)])
