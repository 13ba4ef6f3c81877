"""`--csv TABLE`: one table as CSV on stdout, every row (not only the top ones), sizes in bytes, times in ms.

memory: buffers | ops        analyze: steps | ops | stages
"""

from __future__ import annotations

import csv
import sys

from tpuprof.errors import UserError

MEMORY_TABLES = ("buffers", "ops")
ANALYZE_TABLES = ("steps", "ops", "stages")


def _check(table: str, choices: tuple[str, ...], command: str) -> None:
    if table not in choices:
        raise UserError(f"`{command} --csv` writes one of: {', '.join(choices)} (got {table!r}).")


def _write(header: list[str], rows) -> None:
    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    sys.stdout.flush()


def check_memory(table: str) -> None:
    _check(table, MEMORY_TABLES, "memory")


def check_analyze(table: str) -> None:
    _check(table, ANALYZE_TABLES, "analyze")


def print_memory(results, table: str) -> None:
    """The memory command's ModuleMemory results: one row per buffer or per framework op, all modules."""
    check_memory(table)
    if table == "buffers":
        _write(["module", "instruction", "shape", "size_bytes", "unpadded_bytes", "padding_bytes", "expansion",
                "allocation_type", "live_at_peak", "op_name", "source_line"],
               ([m.name, b.instruction, b.shape, b.size_bytes, b.unpadded_bytes, b.padding_bytes,
                 round(b.expansion, 3), b.allocation_type, int(b.live_at_peak), b.op_name, b.source_line]
                for m in results for b in m.buffers))
    else:
        _write(["module", "scope", "op_name", "size_bytes", "unpadded_bytes", "padding_bytes", "buffers",
                "worst_buffer"],
               ([m.name, m.ops_scope, o.op_name, o.size_bytes, o.unpadded_bytes, o.padding_bytes, o.buffers,
                 o.worst_buffer] for m in results for o in m.ops))


def print_analyze(report, table: str) -> None:
    """The analyze command's ProfileSummary: one row per step (per host), per top op, or per tf.data stage."""
    from tpuprof.models.profile import CATEGORIES

    check_analyze(table)
    if table == "steps":
        _write(["host", "step", "start_ms", "duration_ms", *[f"{c}_ms" for c in CATEGORIES], "batches"],
               ([h.host, s.number, round(s.start_ps / 1e9, 4), round(s.duration_ps / 1e9, 4),
                 *[round(getattr(s, f"{c}_ps") / 1e9, 4) for c in CATEGORIES], s.batches]
                for h in report.hosts for s in h.steps))
    elif table == "ops":
        def rates(o):
            found = report.rates(o) if o.where == "device" else None
            per_step = report.ms_per_step(o)
            return [o.hlo_op, o.category, "" if per_step is None else round(per_step, 6),
                    *("" if found is None or getattr(found, k) is None else round(getattr(found, k), 4)
                      for k in ("flops_per_s", "bytes_per_s", "intensity")),
                    (found.bound or "") if found else ""]

        _write(["name", "kind", "where", "count", "self_ms", "hlo_op", "category", "self_ms_per_step", "flops_per_s",
                "bytes_per_s", "intensity", "bound"],
               ([o.name, o.kind, o.where, o.count, round(o.self_ps / 1e9, 4), *rates(o)] for o in report.top_ops))
    else:
        _write(["stage", "kind", "count", "total_ms", "self_ms", "py_function_ms"],
               ([s.name, s.kind, s.count, round(s.total_ps / 1e9, 4), round(s.self_ps / 1e9, 4),
                 round(s.py_function_ps / 1e9, 4)] for s in report.stages))
