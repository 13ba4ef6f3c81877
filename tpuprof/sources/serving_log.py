"""What a serving engine's start-up log says about the server: the model, the TPU, the settings it was started
with, and the engine's own memory figures (vLLM on TPU, that is vLLM with the tpu-inference backend).

The lines read, as vLLM and tpu-inference print them (tests/fixtures/serving holds public examples):

    non-default args: {'model': 'google/gemma-4-E2B-it', 'max_model_len': 16384, 'gpu_memory_utilization': 0.95}
    Initializing a V1 LLM engine (v0.26.0) with config: model='...', max_seq_len=512, tensor_parallel_size=1, ...
    TPU info: node_name=... | tpu_type=v5litepod-1 | worker_id=0 | num_chips=1 | num_cores_per_chip=1
    Memory statistics | total_hbm_limit_gb=15.75GiB | total_hbm_limit_cap_gb=14.96GiB | total_hbm_used_gb=8.97GiB | ...
    GPU KV cache size: 348,896 tokens
    Maximum concurrency for 16,384 tokens per request: 21.29x
    Using KV cache block size: 256    /    Using cache_config.block_size: 32 ...
    vllm serve MODEL --tensor-parallel-size 8 --max-model-len=8192 ...    (a command pasted beside the log)

Every field is None when the log does not say it: a figure is never guessed here.
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass, fields

GIB = 1 << 30

# vLLM's option names (the CLI spelling with dashes is the same key with underscores).
_OPTIONS = ("model", "tensor_parallel_size", "max_model_len", "max_num_seqs", "max_num_batched_tokens",
            "gpu_memory_utilization", "kv_cache_dtype", "quantization", "block_size", "data_parallel_size")


@dataclass
class ServingSettings:
    engine: str | None = None  # vllm
    engine_version: str | None = None  # "0.26.1rc1.dev125+ga7a204cc6", as the banner or the engine config prints it
    model: str | None = None
    architecture: str | None = None  # the model class vLLM resolved ("Qwen3MoeForCausalLM"): which code runs it
    tpu: str | None = None  # Cloud TPU name: v5litepod-1, v6e-8, tpu7x-8
    devices: int | None = None  # devices the engine's mesh spans
    tensor_parallel_size: int | None = None
    data_parallel_size: int | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    gpu_memory_utilization: float | None = None
    kv_cache_dtype: str | None = None
    quantization: str | None = None
    block_size: int | None = None
    # The engine's memory figures (tpu-inference's "Memory statistics" line: sums over the devices).
    hbm_limit_bytes: int | None = None
    hbm_cap_bytes: int | None = None  # limit x gpu_memory_utilization
    hbm_used_bytes: int | None = None  # weights and other state when the KV cache was sized
    kv_budget_bytes: int | None = None  # cap - used: what the KV cache was given
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    concurrency_tokens: int | None = None  # the "L tokens per request" the concurrency is for

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    @property
    def hbm_limit_per_device(self) -> int | None:
        if self.hbm_limit_bytes is None:
            return None
        return self.hbm_limit_bytes // (self.devices or 1)

    def utilization(self) -> float | None:
        """The --gpu-memory-utilization in force: as set, else as the engine's cap shows it (cap / limit)."""
        if self.gpu_memory_utilization is not None:
            return self.gpu_memory_utilization
        if self.hbm_cap_bytes and self.hbm_limit_bytes:
            return round(self.hbm_cap_bytes / self.hbm_limit_bytes, 2)
        return None

    def any(self) -> bool:
        return any(getattr(self, f.name) is not None for f in fields(self) if f.name != "engine")


_NUMBER = r"(\d[\d,]*)"
_ENGINE_CONFIG = re.compile(r"Initializing an? (?:V1 )?LLM engine \(v([^)\s]+)\) with config: (.*)")
_BANNER_VERSION = re.compile(r"\u2588\s+version (\d+\.\d+\.\d+\S*)")  # vLLM's start-up banner: "\u2588 version 0.26.0"
_ARCHITECTURE = re.compile(r"Resolved architecture: (\w+)")
_TPU_INFO = re.compile(r"TPU info:.*?tpu_type=([\w.-]+)(?:.*?num_chips=(\d+))?(?:.*?num_cores_per_chip=(\d+))?")
_MEMORY = re.compile(r"Memory statistics \|(.*)")
_GB_FIELD = re.compile(r"(total_hbm_\w+?)_gb=([\d.]+)GiB")
_KV_TOKENS = re.compile(rf"GPU KV cache size:\s*{_NUMBER} tokens")
_CONCURRENCY = re.compile(rf"Maximum concurrency for {_NUMBER} tokens per request:\s*([\d.]+)x")
_CHUNKED = re.compile(r"Chunked prefill is enabled with max_num_batched_tokens=(\d+)")  # the value in force, set or not
_BLOCK = re.compile(r"(?:Using KV cache block size:|cache_config\.block_size:)\s*(\d+)")
_MESH = re.compile(r"mesh=Mesh\(([^)]*)\)")  # tpu-inference's device mesh: "Mesh('data': 1, 'model': 4, ..."
_NON_DEFAULT = re.compile(r"non-default args: (\{.*\})")
_SERVE = re.compile(r"\bvllm\s+serve\b")
_SHARDING = re.compile(r"ShardingStrategy\(tensor_parallelism=(\d+)")
_SLICE_PROSE = re.compile(r"\b((?:v5litepod|v5e|v6e|v5p|v4|tpu7x|v7x)-\d+)\b")
_TP_PROSE = re.compile(r"\bTP\s*=\s*(\d+)\b")
_CLI_OPTION = re.compile(r"--([a-z][\w-]*)(?:[= ]+(?!--)('[^']*'|\"[^\"]*\"|\S+))?")
# "gpu_memory_utilization=0.98", "gpu-memory-utilization 0.95", "the gpu-memory-utilization value from 0.93 to 0.83"
# (the value the failing server had comes first).
_GPU_UTIL_PROSE = re.compile(r"gpu[_-]memory[_-]utilization(?: value)?(?: from)?\s*[=: ]\s*([01]?\.\d+)\b")


def read(text: str) -> ServingSettings:
    """The serving settings and engine figures TEXT states (the last statement of each wins: a restarted server's
    log holds both starts, and the failure follows the last)."""
    found = ServingSettings()
    if re.search(r"\b(?i:vllm)\b|tpu_inference|tpu_jax_runner|\(EngineCore(?:_DP\d+)? pid=\d+\)|GPU KV cache size:", text):
        found.engine = "vllm"
    for match in _ENGINE_CONFIG.finditer(text):
        found.engine_version = match.group(1)
        _engine_config(match.group(2), found)
    if found.engine_version is None:
        for banner in _BANNER_VERSION.finditer(text):
            found.engine_version = banner.group(1)
    model_axis = None
    for match in _SHARDING.finditer(text):
        found.tensor_parallel_size = int(match.group(1))
    for match in _SERVE.finditer(text):
        _serve_command(_continued(text, match.end()), found)
    for match in _CHUNKED.finditer(text):
        found.max_num_batched_tokens = int(match.group(1))
    for match in _NON_DEFAULT.finditer(text):
        _non_default_args(match.group(1), found)
    for match in _TPU_INFO.finditer(text):
        found.tpu = match.group(1)
    for match in _ARCHITECTURE.finditer(text):
        found.architecture = match.group(1)
    for match in _MESH.finditer(text):
        axes = {name: int(size) for name, size in re.findall(r"'(\w+)':\s*(\d+)", match.group(1))}
        if axes:
            found.devices = math.prod(axes.values())
            model_axis = axes.get("model")
    for match in _MEMORY.finditer(text):
        values = {name: float(value) for name, value in _GB_FIELD.findall(match.group(1))}
        for name, attribute in (("total_hbm_limit", "hbm_limit_bytes"), ("total_hbm_limit_cap", "hbm_cap_bytes"),
                                ("total_hbm_used", "hbm_used_bytes"), ("total_hbm_avail", "kv_budget_bytes")):
            if name in values:
                setattr(found, attribute, int(round(values[name] * GIB)))
    if found.tensor_parallel_size is None and model_axis:
        found.tensor_parallel_size = model_axis  # tpu-inference shards tensor parallelism over the 'model' axis
    for match in _KV_TOKENS.finditer(text):
        found.kv_cache_tokens = int(match.group(1).replace(",", ""))
    for match in _CONCURRENCY.finditer(text):
        found.concurrency_tokens = int(match.group(1).replace(",", ""))
        found.max_concurrency = float(match.group(2))
    for match in _BLOCK.finditer(text):
        found.block_size = found.block_size or int(match.group(1))
    if found.gpu_memory_utilization is None:
        prose = _GPU_UTIL_PROSE.search(text)
        if prose:
            found.gpu_memory_utilization = float(prose.group(1))
    if found.tpu is None:
        named = _SLICE_PROSE.search(text)
        found.tpu = named.group(1) if named else None
    if found.tensor_parallel_size is None:
        prose = _TP_PROSE.search(text)
        found.tensor_parallel_size = int(prose.group(1)) if prose else None
    if found.tpu is None and found.devices:
        kind = re.search(r"TFRT TPU (v\d+\s*\w*)|TPU (v\d+[a-z]*|7x)\b", text)
        if kind:
            from tpuprof import targets

            try:
                generation = targets.get(kind.group(1) or kind.group(2)).name
            except Exception:  # an unknown chip name: the TPU stays unsaid
                generation = None
            if generation:
                found.tpu = f"{generation}-{found.devices}"
    return found


def _set(found: ServingSettings, key: str, value) -> None:
    key = key.replace("-", "_")
    if key == "model_tag":
        key = "model"
    if key == "tensor_parallel":
        key = "tensor_parallel_size"
    if key not in _OPTIONS or value is None:
        return
    try:
        if key in ("tensor_parallel_size", "max_model_len", "max_num_seqs", "max_num_batched_tokens",
                   "block_size", "data_parallel_size"):
            value = int(str(value).replace(",", "").replace("_", ""))
        elif key == "gpu_memory_utilization":
            value = float(value)
        else:
            value = str(value).strip("'\"")
    except ValueError:
        return
    setattr(found, key, value)


def _engine_config(config: str, found: ServingSettings) -> None:
    for key, value in re.findall(r"(\w+)=('[^']*'|[^,\s]+)", config):
        if key == "max_seq_len":
            key = "max_model_len"
        if key in ("quantization", "kv_cache_dtype") and value in ("None", "none"):
            continue
        if key in ("model", "tensor_parallel_size", "max_model_len", "kv_cache_dtype", "quantization",
                   "data_parallel_size"):
            _set(found, key, value)


def _non_default_args(literal: str, found: ServingSettings) -> None:
    try:
        args = ast.literal_eval(literal)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return  # a dict cut short or holding objects: its options stay unsaid
    if isinstance(args, dict):
        for key, value in args.items():
            if isinstance(key, str) and isinstance(value, (str, int, float)):
                _set(found, key, value)


def _continued(text: str, start: int) -> str:
    """The command from START to the end of its line, with the lines a trailing backslash continues it onto."""
    parts = []
    while True:
        end = text.find("\n", start)
        line = text[start:end if end >= 0 else len(text)]
        if not line.rstrip().endswith("\\") or end < 0:
            parts.append(line)
            return " ".join(parts)
        parts.append(line.rstrip()[:-1])
        start = end + 1


def _serve_command(command: str, found: ServingSettings) -> None:
    positional = re.match(r"\s+([\w./-]+/[\w.-]+|[\w.-]+)(?=\s|$)", command)
    if positional and not positional.group(1).startswith("-"):
        _set(found, "model", positional.group(1))
    for name, value in _CLI_OPTION.findall(command):
        _set(found, name, value or None)
