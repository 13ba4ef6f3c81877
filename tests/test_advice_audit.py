"""The advice audit: every real artefact, every sample and every OOM fixture through every command that reads it,
and for each suggestion, its precondition checked on that input (tpuprof.advice.preconditions states them).

The checks read the input their own way where they can (the HLO text's input_output_alias header, the buffers' op
names and dtypes, the log's own lines), not through the advice code they audit. Real artefacts come from
tests/real_data.discovered(): a file added to the shared data folder joins the audit without a change here. Cheap
by construction: no compile (memory runs with compile_=False: the samples carry their TPU dumps), one analysis per
input.
"""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import pytest

import real_data
from tpuprof.errors import UserError
from tpuprof.sources import inputs

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_profiles"
FIXTURES = Path(__file__).resolve().parent / "fixtures"

# What shows a step already recomputes activations: JAX's checkpoint / rematted_computation. XLA's ".remat" clones
# are its own memory pass on any program over the limit, not the step's remat (openxla/xla hlo_rematerialization.cc:
# best->Clone(/*suffix=*/"remat")).
REMATERIALISED = re.compile(r"checkpoint|rematted_computation|/remat\d*\b")
# "18 channels are padded to 24: use 16" (memory and oom): the size chosen against the size now.
USE_SIZE = re.compile(r"(\d+)(?: channels| heads)?(?: of [^:]*)? (?:is|are) padded to (\d+): use (\d+)")
SIXTEEN_BIT = ("bf16", "f16")
EXACT_METHODS = ("buffer_assignment", "recompiled")


def _inputs() -> list[tuple[str, Path]]:
    found = [(f"real:{p.relative_to(real_data.shared_folder())}", p) for p in real_data.discovered()]
    found += [(f"dump:{p.name}", p) for p in sorted((SAMPLES / "dumps").iterdir()) if p.is_dir()]
    found += [(f"estimate:{p.name}", p) for p in sorted((SAMPLES / "estimate").glob("*.txt.gz"))]
    found += [(f"estimate-cpu:{p.name}", p) for p in sorted((SAMPLES / "estimate" / "cpu").iterdir())]
    found += [(f"sample-oom:{p.name}", p) for p in sorted((SAMPLES / "oom").glob("*.txt"))]
    found += [(f"capture:{p.name}", p) for p in sorted((SAMPLES / "captures").iterdir()) if p.is_dir()]
    found += [(f"oom-fixture:{p.relative_to(FIXTURES / 'oom')}", p) for p in sorted((FIXTURES / "oom").rglob("*.txt"))]
    return found


INPUTS = _inputs()


def _target_of(path: Path) -> str:
    """The generation a sample's name gives (`..._v6e.2x4...` -> v6e), v5e for a CPU dump that names none."""
    match = re.search(r"_(v\d+[a-z]*|tpu7x)\b", path.name)
    return match.group(1) if match else "v5e"


@pytest.mark.parametrize("name,path", INPUTS, ids=[name for name, _ in INPUTS])
def test_every_suggestion_rests_on_its_precondition(name, path, tmp_path):
    if path.name.endswith(".txt.gz"):  # the estimate samples: HLO text kept compressed in the repository
        text_file = tmp_path / path.name[: -len(".gz")]
        text_file.write_bytes(gzip.decompress(path.read_bytes()))
        path = text_file
    family = inputs.identify(path).family
    try:
        if family == inputs.MEMORY:
            from tpuprof.commands import memory

            target = None if name.startswith("dump:") or name.startswith("real:") else _target_of(path)
            modules = memory.module_memories(path, target=target, top=15, compile_=False)
            assert modules
            for module in modules:
                audit_memory(path, module)
        elif family == inputs.OOM:
            from tpuprof.commands import oom

            report, estimate, suggestions, _ = oom.explain(str(path))
            audit_oom(path, report, estimate, suggestions)
        elif family == inputs.STEPS:
            from tpuprof.commands import analyze

            audit_steps(analyze.profile_summary(path, workers=1))  # no fork: JAX may be loaded in this process
    except UserError as error:  # a refusal is one sentence and no advice (a GPU capture, a mangled file)
        assert str(error) and "\n" not in str(error).strip()


# --------------------------------------------------------------------------------------------- memory

def audit_memory(path: Path, module) -> None:
    suggestions = module.suggestions
    names = [b.op_name or "" for b in module.buffers]
    exact_figures = module.method in EXACT_METHODS and not module.estimated
    for s in suggestions:
        # "Exact" only where the figures are the TPU compiler's for this program.
        if s.confidence == "exact":
            assert exact_figures or s.saving_bytes is None, (s.kind, module.method)
        if s.kind == "donation":
            # Outputs in argument buffers (the buffer assignment's own count) and the declared aliases.
            assert getattr(module, "aliased_bytes", 0) < 0.5 * module.output_bytes
            assert not getattr(module, "alias_pairs", None)
            if path.is_file() and module.source_kind == "hlo_text":
                header = path.read_text(errors="replace")[:200_000].split("\n", 1)[0]
                assert not re.search(r"input_output_alias=\{\s*\{", header), "donation advised on a donating module"
        if s.kind == "remat":
            assert not any(REMATERIALISED.search(n) for n in names), "remat advised on a rematerialised step"
        if s.kind == "bf16":
            total = sum(b.size_bytes for b in module.buffers)
            sixteen = sum(b.size_bytes for b in module.buffers if b.dtype in SIXTEEN_BIT)
            assert sixteen < 0.25 * total, "bf16 advised on a program that computes in 16 bits"
        if s.kind == "attention":
            assert any(b.live_at_peak and len(_dims(b.shape)) >= 3 and _dims(b.shape)[-1] == _dims(b.shape)[-2]
                       for b in module.buffers), "attention advised without a queries x keys array"
        if s.kind in ("padding", "one_hot"):
            audit_padding_text(s.message, s.saving_bytes, s.confidence)
            if s.kind == "one_hot":
                assert re.search(r"one_?hot", s.message, re.I)
        if s.kind == "batch_size" and s.extra.get("batch"):
            named = re.search(r"per-chip batch of (\d+)", s.message)
            assert named, s.message
            batch = int(named.group(1))
            parameters_minor = {_dims(b.shape)[-1] for b in module.buffers
                                if b.allocation_type == "parameter" and b.shape and len(_dims(b.shape)) >= 2}
            assert batch not in parameters_minor, f"batch {batch} is a weight's size"
            assert s.extra["batch"] < batch  # the batch that fits is smaller than the one that does not


def _dims(shape: str) -> tuple[int, ...]:
    match = re.match(r"\s*[a-z]\w*\[([\d,]*)\]", shape or "")
    return tuple(int(d) for d in match.group(1).split(",") if d) if match else ()


def audit_padding_text(message: str, saving: int | None, confidence: str) -> None:
    """Only sizes that hold no more data (never round up), no fix on the batch or the class count, a saving > 0."""
    for size, padded, use in USE_SIZE.findall(message):
        assert int(use) < int(size) <= int(padded), f"padding fix grows the data: {message}"
    assert "per-chip batch of" not in message and "mask the extra logits" not in message, message
    assert saving is None or saving > 0
    if saving is not None and "one-hot" not in message and "one_hot" not in message:
        assert confidence != "exact", "a size the program does not have is not the compiler's figure"


# --------------------------------------------------------------------------------------------- oom

_DECLARED = re.compile(r"\b(?:per_chip_batch(?:_size)?|per_device_(?:train_)?batch_size)\s*[=:]\s*(\d+)\b")


def audit_oom(path: Path, report, estimate, suggestions: list[dict]) -> None:
    text = path.read_text(errors="replace")
    declared = _DECLARED.search(text[:1 << 16])
    if declared and report.kind == "compile":
        assert estimate.current_batch == int(declared.group(1)), "the log's own per-chip batch was not used"
    allocations = [a for a in report.allocations if a.dims]
    labels = [f"{a.op_name or ''} {a.xla_label or ''}" for a in report.allocations]
    listed_bytes = sum(a.size_bytes or 0 for a in report.allocations)
    missing = _shortfall(report)
    for s in suggestions:
        kind, message = s["kind"], s["message"]
        if s.get("severity") == "blocking" and s.get("saving_bytes") is not None and missing:
            low = s.get("saving_bytes_range", [s["saving_bytes"]])[0]
            assert low >= missing or s["kind"] in ("shape_bug",), f"'enough to fit' without the arithmetic: {s}"
        if kind == "live_buffers":
            assert "saving_bytes" not in s, "a run-time shortfall presented as a saving"
            if getattr(report, "failed_in", None) == "xm.mark_step":
                assert "call xm.mark_step()" not in s.get("code", "")
        if kind == "batch_size":
            guessed = re.search(r"lead with a dimension of (\d+)", message)
            if guessed:
                size = int(guessed.group(1))
                assert all(size not in a.dims[1:] for a in allocations), f"{size} is a feature size: {message}"
                assert any(len(a.dims) >= 3 and a.dims[0] == size for a in allocations), message
        if kind == "remat":
            assert not any(REMATERIALISED.search(label) for label in labels), "remat on a rematerialised step"
        if kind == "bf16":
            sixteen = sum(a.size_bytes or 0 for a in report.allocations
                          if (a.dtype or (a.shape or "").split("[")[0]) in SIXTEEN_BIT)
            assert sixteen < 0.25 * listed_bytes, "bf16 advised on a program that computes in 16 bits"
        if kind == "donation":
            assert report.output_shared_bytes is not None and report.output_shared_bytes < 0.5 * report.output_bytes
        if kind == "padding":
            audit_padding_text(message, s.get("saving_bytes"), s.get("confidence", "estimated"))


def _shortfall(report) -> int | None:
    from tpuprof.advice.oom import shortfall

    return shortfall(report)


# --------------------------------------------------------------------------------------------- steps

def audit_steps(report) -> None:
    for s in report.suggestions:
        # Every suggestion that claims a figure says what it rests on.
        if s.get("saving_ms_per_step") is not None or s.get("saving_bytes") is not None:
            assert s.get("evidence") or s.get("confidence") == "exact", s
