"""`tpuprof oom`: explain a TPU out-of-memory error from a pasted message or a whole training log.

Exit codes: 0 an OOM was found and explained; 2 bad input, or no TPU out-of-memory error in the text.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tpuprof.errors import UserError


def run(path: str | None, dump: Path | None = None, batch: int | None = None, target: str | None = None,
        as_json: bool = False) -> None:
    from tpuprof import targets
    from tpuprof.advice import oom as advice
    from tpuprof.analyses import oom as analysis
    from tpuprof.sources import oom_log

    if batch is not None and batch < 1:
        raise UserError("--batch must be a positive number of examples.")
    capacity = targets.get(target).compiler_hbm_bytes if target else None
    if path in (None, "-") and sys.stdin.isatty():
        raise UserError("give the log file, or pipe the log into `tpuprof oom -`.")
    stream, opened = oom_log.open_input(path)
    source = "stdin" if path in (None, "-") else str(path)
    try:
        report = analysis.find_in_stream(stream, target)
    finally:
        if opened:
            stream.close()
    if report is None:
        raise UserError(f"no TPU out-of-memory error found in {source}.")
    if report.capacity_bytes is None and capacity is not None and report.memory_space in ("hbm", None):
        report.notes.append(f"capacity taken from --target {target}: {analysis.format_bytes(capacity)}")
    estimate = analysis.estimate_batch(report, batch, capacity)
    suggestions = advice.suggest(report, estimate)
    dump_rows = join_dump(report, dump, target) if dump else None

    if as_json:
        document = report.to_json()
        document["batch_estimate"] = estimate.to_json()
        document["suggestions"] = suggestions
        if dump_rows is not None:
            document["dump"] = dump_rows
        print(json.dumps(document, indent=2))
        return
    from tpuprof.renderers import oom as renderer

    renderer.render(report, estimate, suggestions, source, dump_rows)


def join_dump(report, dump: Path, target: str | None) -> list[dict]:
    """Match the log's allocations to the dump's buffers by shape (and size), largest first."""
    from tpuprof.analyses import memory

    if not dump.exists():
        raise UserError(f"{dump} does not exist.")
    modules = memory.analyze_path(dump, None, target)
    buffers = [b for m in modules for b in m.buffers]
    if not buffers:
        raise UserError(f"{dump} holds no buffer assignment.")
    rows = []
    used: set[int] = set()
    for entry in report.allocations:
        if not entry.shape:
            continue
        wanted = entry.shape.replace(" ", "")
        match = next((b for b in buffers if id(b) not in used and b.shape.replace(" ", "") == wanted), None)
        if match is None:
            continue
        used.add(id(match))
        rows.append({"index": entry.index, "instruction": match.instruction, "shape": match.shape,
                     "size_bytes": match.size_bytes, "unpadded_bytes": match.unpadded_bytes,
                     "op_name": match.op_name, "source_line": match.source_line})
    if not rows:  # no listed shapes (a short message): show the dump's largest buffers instead
        for b in sorted(buffers, key=lambda b: -b.size_bytes)[:10]:
            rows.append({"instruction": b.instruction, "shape": b.shape, "size_bytes": b.size_bytes,
                         "unpadded_bytes": b.unpadded_bytes, "op_name": b.op_name,
                         "source_line": b.source_line})
    return rows
