"""tpuprof: will my model fit in TPU HBM, why not, and why is my step slow.

The commands as Python functions, each returning a typed result with `.to_dict()` (the command's --json
document), `.to_json()`, `.suggestions` and a notebook view:

    import tpuprof
    tpuprof.memory("dump/")                      # MemoryResult
    tpuprof.analyze("logs/")                     # AnalyzeResult
    tpuprof.oom(error_text, batch=128)           # OomResult
    tpuprof.preflight(step, params, x, y, tpu="v5e", max_batch=True)   # PreflightResult
    tpuprof.capture(port=9012, analyze=True)     # CaptureResult
    tpuprof.diff("before/", "after/")            # DiffResult
    tpuprof.report(["dump/", "logs/"], "report.html")                # ReportResult
    tpuprof.trace("logs/", "steps.pftrace", steps="10:13")           # TraceResult
    tpuprof.serve("llama3.1-70b", "v6e-8", max_model_len=8192)      # ServeResult

Bad input raises `tpuprof.UserError` with the sentence the CLI prints. Importing tpuprof is light: TensorFlow
and JAX are imported only by the functions that need them.
"""

from tpuprof.version import __version__
from tpuprof.api import analyze, capture, diff, memory, oom, preflight, report, serve, trace
from tpuprof.errors import UserError
from tpuprof.results import (
    AnalyzeResult, CaptureResult, DiffResult, MemoryResult, OomResult, PreflightResult, ReportResult, Result,
    ServeResult, TraceResult,
)

__all__ = [
    "analyze", "capture", "diff", "memory", "oom", "preflight", "report", "serve", "trace", "UserError",
    "AnalyzeResult", "CaptureResult", "DiffResult", "MemoryResult", "OomResult", "PreflightResult", "ReportResult",
    "Result", "ServeResult", "TraceResult", "__version__",
]
