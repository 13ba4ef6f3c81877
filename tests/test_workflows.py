"""Small workflow fixes: the option names and values each command accepts, and a Hugging Face model folder as
preflight's --model."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import DUMPS, ROOT, run_cli

DUMP = DUMPS / "int8_matmul_v5e"


def test_memory_takes_tpu_as_preflight_does_and_target_as_an_alias():
    by_tpu = run_cli("memory", DUMP, "--tpu", "v5p", "--json")
    by_target = run_cli("memory", DUMP, "--target", "v5p", "--json")
    assert by_tpu.returncode == 0, by_tpu.stderr
    assert json.loads(by_tpu.stdout) == json.loads(by_target.stdout)
    assert json.loads(by_tpu.stdout)["modules"][0]["hbm_capacity_bytes"] != json.loads(
        run_cli("memory", DUMP, "--json").stdout)["modules"][0]["hbm_capacity_bytes"]


@pytest.mark.parametrize("command, path", [("memory", DUMP), ("analyze", ROOT / "sample_profiles" / "captures" / "jax_compute")])
def test_negative_top_is_a_usage_error(command, path):
    result = run_cli(command, path, "--top", "-3")
    assert result.returncode == 2 and "Invalid value for '--top': -3 is not in the range x>=0." in result.stderr


@pytest.mark.parametrize("other", [["--json"], ["--format", "markdown"]])
def test_csv_with_another_format_is_refused(other):
    result = run_cli("memory", DUMP, "--csv", "ops", *other)
    assert result.returncode == 2 and f"--csv ops and {' '.join(other)} ask for two formats: give one." in result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_preflight_model_takes_a_hugging_face_model_folder(tmp_path):
    from tpuprof.sources import llm

    folder = tmp_path / "Qwen2.5-7B"
    folder.mkdir()
    shutil.copy(ROOT / "tpuprof" / "llm_configs" / "qwen2.5-7b.json", folder / "config.json")
    config, source = llm.load_config(str(folder))
    assert source == str(folder / "config.json") and config == llm.load_config(str(folder / "config.json"))[0]
    # The CLI reads the folder's config and goes on to the next check (no compile here).
    result = run_cli("preflight", "--model", folder, "--tpu", "v6e-16")
    assert result.returncode == 2 and "give one of --batch-per-chip N, --global-batch N or --max-batch" in result.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    result = run_cli("preflight", "--model", empty, "--tpu", "v6e-16", "--batch-per-chip", "1")
    assert result.returncode == 2 and "is a folder without a config.json" in result.stderr


def test_sample_dumps_name_their_sources_relative_to_the_repository():
    """The committed samples were made on some machine: their op metadata names files as a reader's checkout has
    them (sample_profiles/models/conv18.py, tensorflow/python/...), never that machine's absolute paths."""
    import re

    from tpuprof.protos import hlo_pb2

    absolute = re.compile(r'(?:^\d+ "|source_file=")/', re.MULTILINE)
    names = set()
    for folder in sorted(DUMPS.iterdir()):
        for path in sorted(folder.glob("*.hlo.pb")):
            module = hlo_pb2().HloProto.FromString(path.read_bytes()).hlo_module
            found = {i.metadata.source_file for c in module.computations for i in c.instructions} | set(
                module.stack_frame_index.file_names)
            assert not [name for name in found if name.startswith("/")], path
            names |= found
        for path in sorted(folder.glob("*.txt")):
            assert not absolute.search(path.read_text()), path
    assert "sample_profiles/models/conv18.py" in names  # the user's model, as memory's source lines show it
