"""Versioned --json documents: every command's output on every sample names its schema and validates against the
JSON Schema shipped in the package; report and diff recognise documents by that name, and documents written
before it existed still load."""

from __future__ import annotations

import json

import pytest
from jsonschema import Draft202012Validator
from referencing import Registry, Resource

from conftest import DUMPS, SAMPLES, run_cli
from helpers.sample_documents import commands, document as sample_document

from tpuprof import schemas

REGISTRY = Registry().with_resources(
    (file, Resource.from_contents(schema)) for file, schema in schemas.all_schemas().items())


def validate(document: dict) -> str:
    """The command the document's schema names, once the document has passed that command's JSON Schema."""
    named = schemas.parse(document.get("schema"))
    assert named is not None, f"no tpuprof schema name in {list(document)[:5]}"
    command, version = named
    assert version == schemas.VERSIONS[command]
    validator = Draft202012Validator(schemas.schema(command), registry=REGISTRY)
    errors = sorted(validator.iter_errors(document), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{'/'.join(map(str, e.absolute_path))}: {e.message[:300]}" for e in errors[:10])
    return command


def cli_json(args, exit_code: int = 0, env: dict | None = None) -> dict:
    result = run_cli(*args, "--json", timeout=600, env=env)
    assert result.returncode == exit_code, result.stderr
    return json.loads(result.stdout)


def test_the_schemas_are_valid_json_schemas_shipped_in_the_package():
    for command in schemas.VERSIONS:
        schema = schemas.schema(command)
        Draft202012Validator.check_schema(schema)
        assert schema["properties"]["schema"] == {"const": schemas.name(command)}
        assert "schema" in schema["required"]


@pytest.mark.parametrize("sample", commands(), ids=lambda c: c[0])
def test_every_sample_document_follows_its_schema(sample):
    written = sample_document(sample)
    assert list(written)[0] == "schema"  # the first thing a reader sees
    assert validate(written) == sample[1][0]


def test_trace_document_follows_its_schema_and_says_what_was_written(tmp_path):
    output = tmp_path / "steps.pftrace"
    document = cli_json(["trace", str(SAMPLES / "captures" / "jax_compute"), "-o", str(output)])
    assert validate(document) == "trace"
    assert document["output"] == str(output) and document["bytes"] == output.stat().st_size
    assert len(document["steps"]) == 3  # the default window: the median step and one either side


def test_report_document_follows_its_schema(tmp_path):
    document = cli_json(["report", str(DUMPS / "conv18_f32_v5e"), str(SAMPLES / "captures" / "tf_slow_map"),
                         "-o", str(tmp_path / "page.html")])
    assert validate(document) == "report"


def test_capture_document_with_its_analysis_follows_its_schema(profiler_job, tmp_path):
    job = profiler_job("jax_job.py", "--slow-loader-ms", "20")
    document = cli_json(["capture", "--service-addr", job.address, "--logdir", str(tmp_path / "logs"),
                         "--duration", "1s", "--analyze"])
    assert validate(document) == "capture"
    assert validate(document["analysis"]) == "analyze"


def test_a_schema_violation_is_caught():
    """The validation can fail: a memory document with a negative peak or without modules does not pass."""
    document = cli_json(["memory", str(DUMPS / "conv18_f32_v5e")])
    document["modules"][0]["peak_heap_bytes"] = -1
    with pytest.raises(AssertionError, match="peak_heap_bytes"):
        validate(document)
    del document["modules"]
    with pytest.raises(AssertionError, match="modules"):
        validate(document)


# ------------------------------------------------------------------------------------------------ reading back


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """memory --json of diff_b64 and diff_b128, saved: as *.json, and b64's also as *.txt and without its
    schema (as tpuprof wrote it before documents were versioned)."""
    folder = tmp_path_factory.mktemp("documents")
    files = {}
    for name in ("diff_b64", "diff_b128"):
        document = cli_json(["memory", str(DUMPS / name)])
        files[name] = folder / f"{name}.json"
        files[name].write_text(json.dumps(document, indent=2))
    document = json.loads(files["diff_b64"].read_text())
    files["as_text"] = folder / "b64-memory.txt"  # not *.json: recognised by its schema name
    files["as_text"].write_text(json.dumps(document, indent=2))
    document.pop("schema")
    files["unversioned"] = folder / "old.json"
    files["unversioned"].write_text(json.dumps(document, indent=2))
    return files


def test_report_and_diff_recognise_a_document_by_its_schema(saved, tmp_path):
    page = cli_json(["report", str(saved["as_text"]), "-o", str(tmp_path / "page.html")])
    assert page["inputs"] == [{"path": str(saved["as_text"]), "kind": "memory"}]
    compared = cli_json(["diff", str(saved["as_text"]), str(saved["diff_b128"])])
    assert compared["kind"] == "memory" and compared["a"]["from_json"] is True and not compared["identical"]


def test_documents_without_a_schema_still_load(saved):
    compared = cli_json(["diff", str(saved["unversioned"]), str(saved["diff_b64"])])
    assert compared["identical"] is True
    assert validate(compared) == "diff"


@pytest.mark.parametrize("schema, message", [
    ("tpuprof.memory/99", "newer than this tpuprof reads (tpuprof.memory/1): upgrade tpuprof."),
    ("tpuprof.diff/1", "report and diff read memory, analyze, oom, preflight and serve documents (diff all but serve)."),
])
def test_documents_report_and_diff_cannot_read_are_one_sentence(saved, tmp_path, schema, message):
    document = json.loads(saved["diff_b64"].read_text())
    document["schema"] = schema
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(document))
    result = run_cli("diff", str(path), str(saved["diff_b64"]))
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith(f"tpuprof: {path}: ") and result.stderr.strip().endswith(message)
