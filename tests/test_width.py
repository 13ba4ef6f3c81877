"""One width rule for every command (tpuprof/renderers/tables.py): each command's human output, piped with
COLUMNS=80 and COLUMNS=100, has no line wider than that and no figure split across lines or cells."""

from __future__ import annotations

import re

import pytest
from rich.cells import cell_len

from conftest import DUMPS, ROOT, SAMPLES, run_cli

CAPTURES = SAMPLES / "captures"
OOM = ROOT / "tests" / "fixtures" / "oom"

COMMANDS = {
    "memory conv18": ["memory", DUMPS / "conv18_f32_v5e", "--top", "20"],
    "memory transformer": ["memory", DUMPS / "transformer_bf16_v6e"],
    "memory tf estimate": ["memory", DUMPS / "tf_hlo_cpu", "--target", "v5e"],
    "oom detailed": ["oom", OOM / "pytorch_xla_3041_indented.txt"],
    "oom gemma": ["oom", OOM / "easydel_142_gemma_bf16.txt"],
    "oom libtpu": ["oom", SAMPLES / "oom" / "libtpu_transformer_v5e.txt"],
    "analyze tf": ["analyze", CAPTURES / "tf_slow_map"],
    "analyze two hosts": ["analyze", CAPTURES / "jax_two_hosts_straggler"],
    "diff dumps": ["diff", DUMPS / "diff_b64", DUMPS / "diff_b128"],
    "diff profiles": ["diff", CAPTURES / "tf_slow_map", CAPTURES / "tf_cached"],
}

BYTES_UNIT = re.compile(r"\b(?:KiB|MiB|GiB|TiB)\b")
DECIMAL = re.compile(r"(?<![\w.])[-+]?\d+\.\d+(?![\w.])")


def check_width(output: str, width: int, reference: str | None = None) -> None:
    """No line wider than WIDTH; every byte size whole (its number on the same line); with the REFERENCE
    output at 200 columns, no decimal number that it does not hold (a fragment of a folded one)."""
    lines = output.splitlines()
    assert lines, "no output"
    for line in lines:
        assert cell_len(line) <= width, f"{cell_len(line)} > {width}: {line!r}"
        for unit in BYTES_UNIT.finditer(line):
            assert re.search(r"\d \Z", line[:unit.start()]), f"a size cut from its number: {line!r}"
    if reference is not None:
        known = set(DECIMAL.findall(reference))
        for line in lines:
            for number in DECIMAL.findall(line):
                assert number in known, f"{number} is not a figure of the wide output (split?): {line!r}"


@pytest.fixture(scope="module")
def wide():
    cache = {}

    def get(name):
        if name not in cache:
            result = run_cli(*COMMANDS[name], env={"COLUMNS": "200"})
            assert result.returncode == 0, result.stderr
            cache[name] = result.stdout
        return cache[name]

    return get


@pytest.mark.parametrize("width", [80, 100])
@pytest.mark.parametrize("name", COMMANDS)
def test_tables_fit_the_width(name, width, wide):
    result = run_cli(*COMMANDS[name], env={"COLUMNS": str(width)})
    assert result.returncode == 0, result.stderr
    check_width(result.stdout, width, wide(name))


def test_pipe_without_columns_is_120_wide():
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    process = subprocess.run([sys.executable, "-m", "tpuprof", "memory", str(DUMPS / "transformer_bf16_v6e")],
                             capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert process.returncode == 0, process.stderr
    assert max(cell_len(line) for line in process.stdout.splitlines()) == 120


def test_narrow_tables_name_what_they_left_out():
    result = run_cli("memory", DUMPS / "conv18_f32_v5e", env={"COLUMNS": "80"})
    assert "left out at 80 columns: unpadded" in result.stdout and "framework op" in result.stdout
    assert "left out" not in run_cli("memory", DUMPS / "conv18_f32_v5e", env={"COLUMNS": "200"}).stdout


def test_long_names_keep_both_ends():
    """At 80 columns a framework op keeps its scope's start and its op's end around the ellipsis."""
    out = run_cli("memory", DUMPS / "conv18_f32_v5e", env={"COLUMNS": "80"}).stdout
    ops = out.split("By framework op")[1]
    assert re.search(r"jit\(train_\S*…\S*conv_general_dilated", ops), ops


@pytest.mark.slow
@pytest.mark.compile
def test_preflight_table_fits(compile_cache):
    """Two generations side by side with their bfloat16 compiles: the program and options of test_preflight.py's
    two-generations test, so that the run's compile cache holds them once for both tests and every width."""
    args = ["preflight", f"{SAMPLES / 'models' / 'narrow_mlp.py'}:factory", "--tpu", "v2,v3", "--batch", "256",
            "--compare-bf16"]
    env = {"XDG_CACHE_HOME": str(compile_cache)}
    reference = run_cli(*args, env={**env, "COLUMNS": "200"}, timeout=600)
    assert reference.returncode == 0, reference.stderr
    for width in (80, 100):
        result = run_cli(*args, env={**env, "COLUMNS": str(width)}, timeout=600)
        assert result.returncode == 0, result.stderr
        check_width(result.stdout, width, reference.stdout)


def test_serve_table_fits():
    """Three slices side by side and their prose (the KV arithmetic alone: no compile)."""
    args = ["serve", "--model", "llama3.1-70b", "--tpu", "v6e-8,v5p-16,v5e-8", "--max-model-len", "8192",
            "--concurrency", "64", "--no-compile"]
    reference = run_cli(*args, env={"COLUMNS": "200"})
    assert reference.returncode == 0, reference.stderr
    for width in (80, 100):
        result = run_cli(*args, env={"COLUMNS": str(width)})
        assert result.returncode == 0, result.stderr
        check_width(result.stdout, width, reference.stdout)


def test_capture_summary_fits(profiler_job, tmp_path):
    job = profiler_job("jax_job.py", "--slow-loader-ms", "20")  # the same job test_capture.py uses
    for width in (80, 100):
        result = run_cli("capture", "--service-addr", job.address, "--logdir", tmp_path / str(width),
                         "--duration", "500ms", env={"COLUMNS": str(width)}, timeout=120)
        assert result.returncode == 0, result.stderr
        check_width(result.stdout, width)


def _every_sample() -> dict[str, list]:
    """Every command with terminal output on every sample the repository holds: each dump and HLO text
    (memory), each capture (analyze), each OOM text (oom) and the diff pairs."""
    cases = {f"memory {p.name}": ["memory", p] for p in sorted(DUMPS.iterdir()) if p.is_dir()}
    cases["memory tf_hlo_cpu"] += ["--target", "v5e", "--no-compile"]  # HLO without TPU layouts
    cases |= {f"memory {p.name}": ["memory", p] for p in sorted((SAMPLES / "estimate").glob("*.txt.gz"))}
    cases |= {f"analyze {p.name}": ["analyze", p] for p in sorted(CAPTURES.iterdir()) if p.is_dir()}
    cases |= {f"oom {p.name}": ["oom", p] for p in sorted(OOM.glob("*.txt")) + sorted((SAMPLES / "oom").glob("*.txt"))}
    cases |= {"diff dumps": COMMANDS["diff dumps"], "diff profiles": COMMANDS["diff profiles"]}
    return cases


EVERY_SAMPLE = _every_sample()


def _in_process(args: list, width: int, monkeypatch, capsys) -> str:
    """The command's stdout at WIDTH columns, run in this process (a process each would cost minutes)."""
    from tpuprof.cli import main

    monkeypatch.setenv("COLUMNS", str(width))
    try:
        main([str(a) for a in args])
    except SystemExit as done:
        assert done.code in (0, None), capsys.readouterr().err
    return capsys.readouterr().out


@pytest.mark.parametrize("name", EVERY_SAMPLE)
def test_every_command_on_every_sample_fits_80_and_100_columns(name, monkeypatch, capsys, tmp_path):
    args = list(EVERY_SAMPLE[name])
    if str(args[1]).endswith(".gz"):  # the estimate suite's HLO texts are stored gzipped
        import gzip

        text = tmp_path / args[1].name[:-3]
        text.write_bytes(gzip.decompress(args[1].read_bytes()))
        args[1] = text
    reference = _in_process(args, 200, monkeypatch, capsys)
    for width in (80, 100):
        output = _in_process(args, width, monkeypatch, capsys)
        check_width(output, width, reference)
        # Columns are cells, not bytes: '…' and '≈' are one column and three UTF-8 bytes, so `awk length` in a
        # byte locale counts a full 100-column line with two of them as 104.
        assert max(len(line) for line in output.splitlines()) <= width
