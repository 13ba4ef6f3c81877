"""The Python API holds what the libraries print, as the CLI does: `tpuprof.preflight()` of a Keras step (TensorFlow,
absl and CUDA print about ten lines while Keras loads and compiles) prints nothing on the script's stderr or into a
notebook's stream; verbose=True shows the lines."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from conftest import ROOT, SAMPLES

# Found, not imported: the tests run in processes of their own, and importing TensorFlow here cost each xdist worker
# about 4 CPU-s while it collected the suite.
pytestmark = pytest.mark.skipif(not all(importlib.util.find_spec(name) for name in ("jax", "tensorflow")),
                                reason="needs jax and tensorflow")

SCRIPT = """
import io, sys
import tpuprof
notebook = io.StringIO()
if {notebook}:
    sys.stderr = notebook  # as ipykernel replaces it; fd 2 stays the process's
result = tpuprof.preflight({spec!r}, tpu="v3", batch=32, cache=False{verbose})
print("fits" if result.fits else "does not fit")
print("caller's own line", file=sys.stderr)
sys.stderr = sys.__stderr__
print("NOTEBOOK:" + notebook.getvalue().replace(chr(10), "|"))
"""


def run_script(tmp_path, notebook: bool, verbose: bool) -> subprocess.CompletedProcess:
    spec = f"{SAMPLES / 'models' / 'keras_mlp.py'}:factory"
    code = SCRIPT.format(notebook=notebook, spec=spec, verbose=", verbose=True" if verbose else "")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "fits"
    return done


@pytest.mark.slow
@pytest.mark.compile
def test_preflight_in_a_notebook_prints_no_library_line(tmp_path):
    done = run_script(tmp_path, notebook=True, verbose=False)
    assert done.stderr == "" and done.stdout.splitlines()[-1] == "NOTEBOOK:caller's own line|"


@pytest.mark.slow
@pytest.mark.compile
def test_verbose_shows_the_library_lines(tmp_path):
    loud = run_script(tmp_path, notebook=False, verbose=True)
    library_lines = [line for line in loud.stderr.splitlines() if line.strip() and line != "caller's own line"]
    assert library_lines, "no library line with verbose=True: the quiet check above would prove nothing"
    assert "caller's own line" in loud.stderr.splitlines()
