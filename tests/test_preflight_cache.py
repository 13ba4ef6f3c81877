"""Processes share the preflight compile cache: a max-batch search deletes the dumps of the batches it does not
report, and another process may be reading one of them (the same program at the same batch) at that moment. Two
real processes and a real libtpu compile: the reader's dump stays until the reader ends."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import ROOT, SAMPLES

pytest.importorskip("jax")
MODEL = f"{SAMPLES / 'models' / 'int8_matmul.py'}:factory"

# Compiles (or finds in the cache) the model at batch 8 with its dump, prints the dump's folder, then keeps running
# (as a CLI run that still reads the dump does) until its stdin closes.
READER = textwrap.dedent("""
    import sys
    from tpuprof import slices
    from tpuprof.analyses.preflight import Compiler
    from tpuprof.sources.tpu_compile import load_spec
    print(Compiler(load_spec(sys.argv[1]), slices.resolve("v5e"), None).measure(8, dump=True).dump_dir, flush=True)
    sys.stdin.read()
""")


def a_search_that_does_not_report_batch_8():
    from tpuprof import slices
    from tpuprof.analyses.preflight import Compiler
    from tpuprof.sources.tpu_compile import load_spec

    search = Compiler(load_spec(MODEL), slices.resolve("v5e"), None)
    search.measure(8, dump=True)  # a cache hit: the reader compiled it
    search.drop_dumps(keep=set())
    return search


@pytest.mark.compile
def test_a_search_leaves_the_dump_another_process_is_reading(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    reader = subprocess.Popen([sys.executable, "-c", READER, MODEL], cwd=ROOT, env=dict(os.environ),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        dump = Path(reader.stdout.readline().strip())
        assert any(dump.glob("*.after_codegen.hlo.pb")), dump
        assert a_search_that_does_not_report_batch_8().compiles == 0
        assert any(dump.glob("*.after_codegen.hlo.pb")), "the search deleted the dump its reader was reading"
    finally:
        reader.stdin.close()
        reader.wait(timeout=60)
    assert reader.returncode == 0
    a_search_that_does_not_report_batch_8()
    assert not dump.exists(), "nobody reads the dump now: the search's deletion goes ahead"
