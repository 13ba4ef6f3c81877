"""The `tpuprof.memory/1` document (without its schema line and caveats, which `Result.to_dict` adds), built in this
one place from the memory pipeline's typed modules (tpuprof.models.memory.ModuleMemory): `MemoryResult.to_dict()`,
`report` and preflight's document call `document`. It reads models only, like tpuprof/documents.py, which reads the
documents back."""

from __future__ import annotations

from tpuprof.models.memory import ModuleMemory


def document(results: list[ModuleMemory], top: int) -> dict:
    """Every module's figures, its TOP largest buffers and framework ops (0: all) and its suggestions."""
    return {"modules": [_module_json(m, top) for m in results]}


def _module_json(m: ModuleMemory, top: int) -> dict:
    buffers = m.buffers if top <= 0 else m.buffers[:top]
    ops = m.ops if top <= 0 else m.ops[:top]
    return {
        "name": m.name,
        "source": m.source,
        "source_kind": m.source_kind,
        "target": m.target,
        "estimated": m.estimated,
        "method": m.method,
        "expected_error_percent": m.expected_error_percent,
        "peak_range_bytes": list(m.peak_range_bytes) if m.peak_range_bytes else None,
        "notes": m.notes,
        "peak_heap_bytes": m.peak_heap_bytes,
        "peak_unpadded_heap_bytes": m.peak_unpadded_heap_bytes,
        "argument_bytes": m.argument_bytes,
        "output_bytes": m.output_bytes,
        "temp_bytes": m.temp_bytes,
        "allocated_bytes": m.allocated_bytes,
        "required_bytes": m.required_bytes,
        "hbm_capacity_bytes": m.hbm_capacity_bytes,
        "padding_at_peak_bytes": m.padding_at_peak_bytes,
        "other_memory_spaces": {str(k): v for k, v in sorted(m.other_memory_spaces.items())},
        "buffer_count": len(m.buffers),
        "buffers": [
            {
                "instruction": b.instruction,
                "shape": b.shape,
                "size_bytes": b.size_bytes,
                "unpadded_bytes": b.unpadded_bytes,
                "padding_bytes": b.padding_bytes,
                "expansion": round(b.expansion, 3),
                "allocation_type": b.allocation_type,
                "op_name": b.op_name,
                "source_line": b.source_line,
                "live_at_peak": b.live_at_peak,
            }
            for b in buffers
        ],
        "ops_scope": m.ops_scope,
        "ops": [
            {
                "op_name": o.op_name,
                "size_bytes": o.size_bytes,
                "unpadded_bytes": o.unpadded_bytes,
                "padding_bytes": o.padding_bytes,
                "buffers": o.buffers,
                "worst_buffer": o.worst_buffer,
            }
            for o in ops
        ],
        "suggestions": [s.to_dict() for s in m.suggestions],
    }
