"""Reading tpuprof's own --json documents back (`report` and `diff` take them as inputs): the one place that
checks them, so that the renderers and the diff can trust every field they read.

A saved document may have been edited, cut short or written by another tool. Each kind (memory, steps, oom,
preflight, serve) has a spec below that names every field the readers use and its type; a field of another type, a
number that is not finite, negative where a size or a time is meant, or beyond int64, or a missing required
field is a UserError that names the field. Fields the spec does not name are ignored (newer documents may have
more). Issue #16 replaces these specs with versioned JSON Schemas; until then this is the contract.

Spec language: a dict is an object (a key ending in '!' is required, '*' stands for any key); a one-element list
is an array of that; strings are types: int and num are non-negative (snum: any sign), '?' in front allows null.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from tpuprof.errors import UserError

LIMIT = 2**63  # sizes and times in the documents are int64 figures; past this they are not real
_MAX_INT_DIGITS = 40

SUGGESTION = {"kind": "?str", "message": "?str", "saving_bytes": "?num", "saving_ms_per_step": "?num",
              "evidence": "?str", "severity": "?str", "confidence": "?str", "code": "?str", "framework": "?str",
              "source_line": "?str"}
BUFFER = {"instruction!": "str", "shape!": "str", "size_bytes!": "int", "unpadded_bytes!": "int",
          "padding_bytes": "int", "expansion": "num", "allocation_type": "?str", "op_name": "?str",
          "source_line": "?str", "live_at_peak": "?bool", "fix": "?str"}
OP = {"op_name!": "?str", "size_bytes!": "int", "unpadded_bytes": "int", "padding_bytes": "int", "buffers": "?int",
      "worst_buffer": "?str", "fix": "?str"}
TIMELINE = {"position!": ["int"], "padded_bytes!": ["num"], "unpadded_bytes": ["num"], "peak_position": "?int",
            "length": "?int"}
MODULE = {"name!": "str", "source": "?str", "source_kind": "?str", "target": "?str", "estimated": "?bool",
          "method": "?str", "expected_error_percent": "?num", "peak_range_bytes": "?", "peak_range_bytes?": ["int"],
          "notes": ["str"], "caveats": ["str"],
          "peak_heap_bytes": "?int", "peak_unpadded_heap_bytes": "?int", "argument_bytes": "?int",
          "output_bytes": "?int", "temp_bytes": "?int", "allocated_bytes": "?int", "required_bytes": "?int",
          "hbm_capacity_bytes": "?int", "padding_at_peak_bytes": "?int",
          "other_memory_spaces": {"*": "int"}, "buffer_count": "?int", "buffers": [BUFFER], "ops_scope": "?str",
          "ops": [OP], "suggestions": [SUGGESTION], "timeline": "?", "timeline?": TIMELINE}
MEMORY = {"modules!": [MODULE]}

STAGE = {"stage!": "str", "kind": "?str", "count": "int", "total_ms": "num", "self_ms!": "num", "py_function_ms!": "num"}
TOP_OP = {"name!": "str", "kind!": "?str", "where!": "str", "count!": "?int", "self_ms!": "num", "hlo_op": "?str",
          "category": "?str", "program": "?str", "shape": "?str", "self_ms_per_step": "?num", "flops": "?num",
          "bytes_accessed": "?num", "flops_source": "?str", "flops_per_s": "?num", "bytes_per_s": "?num",
          "intensity": "?num", "bound": "?str", "percent_of_roof": "?num"}
CATEGORY_FIGURES = {"*": "num"}
POD_HOST = {"host!": "str", "steps!": "int", "median_ms!": "num", "input_ms": "?num", "host_overhead_ms": "?num",
            "collective_ms": "?num", "clock_offset_ms": "?snum", "delay_ms!": "num", "steps_without_device": "?int"}
POD = {"hosts!": [POD_HOST], "reference_host": "?str", "matched_steps": "?int", "residual_ms": "?num",
       "stragglers": [{"host!": "str", "delay_ms!": "num", "last_steps": "?int"}],
       "compact": "?", "compact?": {"slowest!": [POD_HOST], "median!": [POD_HOST], "fastest!": [POD_HOST],
                                    "outliers!": [POD_HOST]}}
STEPS = {
    "hosts!": [{"host!": "str", "file": "?str", "platform": "?str", "step_source": "?str", "steps": "?int",
                "median_ms": "?num", "breakdown_percent": CATEGORY_FIGURES, "notes": ["str"],
                "step_list": [{"number!": "int", "duration_ms!": "num"}]}],
    "steps!": {"count": "?int", "mean_ms!": "num", "median_ms!": "num", "p90_ms!": "num", "batches_per_step": "?int"},
    "breakdown_percent": CATEGORY_FIGURES, "breakdown_ms_per_step": CATEGORY_FIGURES,
    "input_bound_percent": "num", "verdict": "?str", "verdict_reason": "?str",
    "devices": [{"id!": "str", "host!": "str", "kind!": "?str", "device_type": "?str", "steps!": "?int",
                 "median_ms!": "num", "work_median_ms!": "num", "breakdown_percent!": CATEGORY_FIGURES}],
    "slow_chips": [{"host!": "str", "chip!": "str", "work_median_ms!": "num", "fastest_work_median_ms!": "num"}],
    "roofline": "?", "roofline?": {"device_kind": "?str", "peak_flops_per_s": "?num", "peak_hbm_bytes_per_s": "?num",
                                   "host_link_bytes_per_s": "?num", "ridge_flops_per_byte": "?num",
                                   "peak_source": "?str", "flops_per_s": "?num", "hbm_bytes_per_s": "?num",
                                   "mfu_percent": "?num", "hbm_utilization_percent": "?num"},
    "input_pipeline": {"bottleneck": "?", "bottleneck?": STAGE, "stages": [STAGE]},
    "top_ops": [TOP_OP], "roofline_points": [TOP_OP], "suggestions": [SUGGESTION], "warnings": ["str"],
    "stragglers": [{"host!": "str", "median_ms!": "num", "hosts_median_ms!": "num"}],
    "duty_cycle": "?", "duty_cycle?": {"percent!": "num", "op_ms_per_chip!": "num", "span_ms_per_chip!": "num",
                                       "program_runs_per_chip!": "num", "outside_steps_ms_per_chip": "?num"},
    "caveats": ["str"],
    "run": "?", "run?": {"name!": "str", "folder!": "str", "other_runs": "?int"},
    "per_step": [{"host!": "str", "steps!": [{"number!": "?int", "duration_ms": "num", "*": "?num"}]}],
    "pod": "?", "pod?": POD,
}
ALLOCATION = {"index": "?int", "size_bytes": "?int", "unpadded_bytes": "?int", "recomputed_unpadded_bytes": "?int",
              "recomputed_padded_bytes": "?int", "padding_bytes": "?int", "expansion": "?num", "shape": "?str",
              "op_name": "?str", "op_type": "?str", "source": "?str", "xla_label": "?str", "allocation_type": "?str"}
ALLOCATION["disagreements"] = ["str"]
ALLOCATION["assumed_tiling"] = "?str"
OOM_SERVING = {"engine!": "str", "cause!": "str", "estimated_max_model_len": "?int",
               "settings": "?", "settings?": {"engine_version": "?str", "model": "?str", "tpu": "?str",
                                              "tensor_parallel_size": "?int", "max_model_len": "?int",
                                              "max_num_seqs": "?int", "max_num_batched_tokens": "?int",
                                              "gpu_memory_utilization": "?num", "kv_cache_dtype": "?str",
                                              "block_size": "?int", "kv_cache_tokens": "?int",
                                              "max_concurrency": "?num", "concurrency_tokens": "?int"}}
OOM_DUMP = {"module!": "str", "argument_bytes!": "int", "temp_bytes!": "int", "output_bytes!": "int",
            "buffers!": [{"index": "?int", "instruction!": "str", "shape!": "str", "size_bytes!": "int",
                          "unpadded_bytes!": "int", "allocation_type": "?str", "op_name": "?str"}]}
OOM = {"headline!": "?str", "allocations!": [ALLOCATION], "kind": "str", "memory_space": "?str",
       "required_bytes": "?int", "largest_free_bytes": "?int", "reservable_bytes": "?int", "total_bytes": "?int",
       "output_bytes": "?int", "currently_allocated_bytes": "?int", "tensorcore_bytes": "?int",
       "sparsecore_bytes": "?int", "global_bytes": "?int", "scoped_bytes": "?int", "temp_bytes": "?int",
       "scoped_limit": "?bool", "program_unknown": "?bool", "arguments_unknown": "?bool", "utilization": "?num",
       "error_code": "?str", "error_name": "?str", "program_name": "?str", "framework": "?str", "training": "?bool",
       "kernel": "?str", "serving": "?", "serving?": OOM_SERVING, "dump": "?", "dump?": OOM_DUMP,
       "used_bytes": "?int", "capacity_bytes": "?int", "exceeded_bytes": "?int", "requested_bytes": "?int",
       "free_bytes": "?int", "hlo_temp_bytes": "?int", "unpadded_bytes": "?int", "padded_bytes": "?int",
       "arguments_bytes": "?int", "program_bytes": "?int", "reserved_bytes": "?int", "line_number": "?int",
       "messages_found": "?int", "notes": ["str"], "suggestions": [SUGGESTION],
       "batch_estimate": "?", "batch_estimate?": {"reason": "?str", "scale": "?snum", "confidence": "?str"}}
PREFLIGHT = {"targets!": [{
    "target": "?str", "topology": "?str", "batch_size": "?int", "fits": "?bool", "verdict": "?str",
    "required_bytes": "?int", "hbm_capacity_bytes": "?int", "max_batch_size": "?int", "peak_heap_bytes": "?int",
    "peak_unpadded_heap_bytes": "?int", "argument_bytes": "?int", "temp_bytes": "?int", "dump_dir": "?str",
    "bf16": "?", "bf16?": {"max_batch_size": "?int"}, "oom": {"headline": "?str"},
    "curve": [{"batch_size!": "int", "required_bytes!": "?int", "fits": "?bool"}],
    "memory": "?", "memory?": MODULE,
    "slice": {"name": "?str", "topology": "?str", "chips": "?int", "devices": "?int", "num_slices": "?int"},
    "mesh": {"*": "int"}, "batch_per_chip": "?int", "global_batch": "?int", "state_bytes_per_chip": "?int",
    "estimate": {"step_ms": "?num", "step_ms_low": "?num", "step_ms_high": "?num", "tokens_per_s": "?num",
                 "cost_per_million_tokens": "?num", "cost_per_million_examples": "?num"}}]}
SERVE_BAND = {"point!": "num", "low!": "num", "high!": "num"}
SERVE = {
    "model!": {"name!": "str", "parameters!": "num"},
    "workload!": {"input_len!": "int", "output_len!": "int"},
    "targets!": [{
        "slice!": {"name!": "str"}, "engine!": {"name!": "str", "version!": "str"},
        "tensor_parallel_size!": "int", "replicas!": "int", "max_model_len!": "int", "fits!": "bool",
        "verdict!": "str", "problems!": ["str"], "command!": "str", "bytes_limit_per_device!": "int",
        "gpu_memory_utilization!": "num", "safe_gpu_memory_utilization!": "?num", "margin_bytes!": "?int",
        "weights_bytes_per_device!": "int", "weights_how!": "str", "kv_bytes_per_token_per_device!": "int",
        "kv!": {"head_dim!": "int", "padded_head_dim!": "int", "kv_heads_per_device!": "int", "replicated!": "bool",
                "cache_slots!": "int", "dtype!": "str", "page_size!": "int", "page_size_rule!": "str"},
        "kv_cache_pages!": "int", "kv_cache_tokens!": "int", "max_concurrency!": "num",
        "largest_max_model_len!": "int", "kv_cache_how": "?str", "concurrency": {"note!": "?str"},
        "programs!": "?", "programs?": {"count!": "int", "count_rule!": "str", "compiled!": "int",
                                        "largest!": "?", "largest?": {"kind!": "str", "tokens!": "?int"},
                                        "largest_temp_bytes": "?int", "largest_code_bytes": "?int",
                                        "caveats": ["str"]},
        "estimate!": "?", "estimate?": {"concurrency!": "?int", "decode_step_ms!": SERVE_BAND, "prefill_ms": SERVE_BAND, "bound!": "str",
                                        "tpot_ms!": "num", "tpot_ms_low!": "num", "tpot_ms_high!": "num",
                                        "ttft_ms!": "num", "output_tokens_per_s!": "num",
                                        "output_tokens_per_s_per_chip!": "num",
                                        "cost_per_million_output_tokens!": "?num", "caveats": ["str"]}}],
    "ranking!": {"speed!": ["str"], "cost!": ["str"]},
}
# sample.json beside a committed sample dump: how it was made (advisory: a bad one is ignored).
SAMPLE = {"target": "?str", "batch_size": "?int", "dtype": "?str", "note": "?str"}

SPECS = {"memory": MEMORY, "steps": STEPS, "oom": OOM, "preflight": PREFLIGHT, "serve": SERVE}
_TYPE_NAMES = {"int": "a non-negative integer", "num": "a non-negative number", "snum": "a number", "str": "a string",
               "bool": "true or false"}


def _no_constants(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > _MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(text)} digits")
    return int(text)


def load(path: Path):
    """The JSON value in PATH; NaN, Infinity, huge integers, deep nesting and bad bytes are a UserError."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise UserError(f"cannot read {path}: {error.strerror or error}.") from None
    except UnicodeDecodeError:
        raise UserError(f"{path} is not UTF-8 text: not a tpuprof --json document.") from None
    try:
        return json.loads(text, parse_constant=_no_constants, parse_int=_bounded_int)
    except json.JSONDecodeError as error:
        raise UserError(f"{path} is not valid JSON ({error.msg} at line {error.lineno}).") from None
    except (ValueError, RecursionError) as error:
        reason = "nested too deeply" if isinstance(error, RecursionError) else str(error)
        raise UserError(f"{path} is not valid JSON ({reason}).") from None


def check(document, kind: str, source: str) -> None:
    """Raise a UserError naming the first field of DOCUMENT that does not follow the spec of KIND."""
    problem = _problem(document, SPECS[kind], kind)
    if problem:
        raise UserError(f"{source} is not a usable tpuprof {kind} --json document: {problem}.")


def valid(document, spec) -> bool:
    return _problem(document, spec, "") is None


def _problem(value, spec, where: str) -> str | None:
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            return f"{where or 'the document'} should be an object, not {_kind(value)}"
        for key, field_spec in spec.items():
            if key == "*" or key.endswith("?") and key[:-1] in spec:
                continue  # '*' is checked below; 'x?' is the object form of a nullable 'x'
            name = key.rstrip("!")
            if name not in value:
                if key.endswith("!"):
                    return f"{where}.{name} is missing".lstrip(".")
                continue
            item = value[name]
            if field_spec == "?":  # null, or the object spec under 'name?'
                if item is None:
                    continue
                field_spec = spec[name + "?"]
            problem = _problem(item, field_spec, f"{where}.{name}".lstrip("."))
            if problem:
                return problem
        if "*" in spec:
            named = {k.rstrip("!?") for k in spec}
            for name, item in value.items():
                if name not in named:
                    problem = _problem(item, spec["*"], f"{where}.{name}".lstrip("."))
                    if problem:
                        return problem
        return None
    if isinstance(spec, list):
        if not isinstance(value, list):
            return f"{where} should be a list, not {_kind(value)}"
        for i, item in enumerate(value):
            problem = _problem(item, spec[0], f"{where}[{i}]")
            if problem:
                return problem
        return None
    nullable = spec.startswith("?")
    name = spec.lstrip("?")
    if value is None:
        return None if nullable else f"{where} should be {_TYPE_NAMES[name]}, not null"
    if name == "str":
        ok = isinstance(value, str)
    elif name == "bool":
        ok = isinstance(value, bool)
    elif name == "int":
        ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < LIMIT
    else:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
            and abs(value) < LIMIT and (name == "snum" or value >= 0)
    return None if ok else f"{where} should be {_TYPE_NAMES[name]}, not {_kind(value)}"


def _kind(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return f"the number {value!r:.40}"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
