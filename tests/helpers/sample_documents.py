"""Every sample in sample_profiles/ with the command that reads it, and its --json document: what the schema
test validates (tests/test_schemas.py) and the golden test compares (tests/test_golden.py, tests/golden.py).

Paths are given relative to the repository (the CLI runs there), so the documents do not depend on where the
clone is. Preflight's samples are factories in sample_profiles/models/; the cheap ones are compiled here (about a
second each) with a compile cache of this process's own.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from helpers.cli import run_cli, run_cli_process
from helpers.jobs import RUN_FOLDER_VARIABLE
from helpers.paths import DUMPS, ROOT, SAMPLES

CAPTURES = SAMPLES / "captures"
OOM_LOGS = SAMPLES / "oom"
MODELS = SAMPLES / "models"


def _relative(path) -> str:
    return str(path.relative_to(ROOT))


def _target(dump) -> str:
    """The generation a sample dump was made for (sample.json): HLO without TPU layouts needs it."""
    return json.loads((dump / "sample.json").read_text())["target"]


def commands() -> list[tuple[str, list[str], int]]:
    """(id, CLI arguments without --json, expected exit code) for every sample."""
    found = []
    for dump in sorted(p for p in DUMPS.iterdir() if p.is_dir()):
        found.append((f"memory/{dump.name}", ["memory", _relative(dump), "--target", _target(dump)], 0))
    for capture in sorted(p for p in CAPTURES.iterdir() if p.is_dir()):
        found.append((f"analyze/{capture.name}", ["analyze", _relative(capture)], 0))
    for log in sorted(OOM_LOGS.glob("*.txt")):
        found.append((f"oom/{log.stem}", ["oom", _relative(log), "--batch", "128"], 0))
    mlp = _relative(MODELS / "mlp.py")
    found += [
        ("preflight/mlp_factory_bf16", ["preflight", f"{mlp}:factory", "--tpu", "v5e", "--batch", "64",
                                        "--compare-bf16"], 0),
        ("preflight/mlp_too_large", ["preflight", f"{mlp}:too_large", "--tpu", "v5e", "--batch", "8"], 0),
        ("diff/memory", ["diff", _relative(DUMPS / "diff_b64"), _relative(DUMPS / "diff_b128"), "--fail-if",
                         "peak_heap_bytes>+5%"], 1),  # exit 1: the threshold trips
        ("diff/steps", ["diff", _relative(CAPTURES / "tf_tiny_spe1"), _relative(CAPTURES / "tf_tiny_spe64")], 0),
    ]
    return found


@functools.lru_cache(maxsize=None)
def _compile_cache() -> str:
    """A compile cache of the samples' own, not the session's: their golden documents hold how many compiles a
    first run makes, which another test's compile of the same program would change. In a test run, one for all
    its xdist workers, in the run folder: a document one worker made may name a dump in it."""
    run_folder = os.environ.get(RUN_FOLDER_VARIABLE)
    if run_folder:
        return tempfile.mkdtemp(prefix="tpuprof-samples-xdg-", dir=run_folder)
    folder = tempfile.mkdtemp(prefix="tpuprof-samples-xdg-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


@functools.lru_cache(maxsize=None)
def _run(args: tuple[str, ...], exit_code: int) -> str:
    """The command's stdout, once per test run: xdist's workers share it through the run folder (a preflight
    sample's compiles took each worker 45-60 s), the first computes it while the other waits."""
    run_folder = os.environ.get(RUN_FOLDER_VARIABLE)
    if not run_folder:
        return _run_command(args, exit_code)
    from filelock import FileLock

    from tpuprof.renderers.output import write_atomically

    kept = Path(run_folder) / "sample-documents" / hashlib.sha256(json.dumps(args).encode()).hexdigest()[:32]
    kept.parent.mkdir(exist_ok=True)
    with FileLock(f"{kept}.lock"):
        if kept.is_file():
            return kept.read_text()
        stdout = _run_command(args, exit_code)
        write_atomically(kept, stdout)
        return stdout


def _run_command(args: tuple[str, ...], exit_code: int) -> str:
    # preflight in a process of its own, as users run it: its dump's file names number the process's compiles
    # (module_0000...), and the document's memory source names that file.
    run = run_cli_process if args[0] == "preflight" else run_cli
    result = run(*args, "--json", timeout=600, env={"XDG_CACHE_HOME": _compile_cache()})
    if result.returncode != exit_code:
        raise AssertionError(f"tpuprof {' '.join(args)} exited {result.returncode}: {result.stderr}")
    return result.stdout


def document(sample: tuple[str, list[str], int]) -> dict:
    """The sample's --json document (each command runs once per test run; every caller gets its own copy)."""
    _, args, exit_code = sample
    return json.loads(_run(tuple(args), exit_code))
