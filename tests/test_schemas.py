"""Versioned --json documents: every command's output on every sample names its schema and validates against the
JSON Schema shipped in the package; report and diff recognise documents by that name, and documents written
before it existed still load."""

from __future__ import annotations

import json

import pytest
from jsonschema import Draft202012Validator

from conftest import DUMPS, ROOT, SAMPLES, run_cli
from helpers.sample_documents import commands, document as sample_document
from helpers.schema_check import validate

from tpuprof import schemas


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


# ------------------------------------------------------------------------------- the schemas are the readers' contract

GOLDEN = ROOT / "tests" / "golden"
READ = {"memory": "memory", "analyze": "steps", "oom": "oom", "preflight": "preflight"}  # command -> input kind
# What fastjsonschema (draft 7) and JSON Schema 2020-12 both mean the same by: the schemas the readers check
# against may use no other keyword, or the check and the published contract would part.
SHARED_KEYWORDS = {"$schema", "$id", "$ref", "title", "description", "type", "properties", "required", "items",
                   "additionalProperties", "anyOf", "oneOf", "allOf", "not", "enum", "const", "minimum", "maximum",
                   "exclusiveMinimum", "exclusiveMaximum", "minItems", "maxItems", "minLength", "maxLength",
                   "pattern", "minProperties", "maxProperties"}


def _keywords(schema, found: set) -> set:
    if isinstance(schema, dict):
        for key, value in schema.items():
            found.add(key)
            if key == "items":
                assert isinstance(value, dict), "items as a list means another thing in 2020-12 than in draft 7"
            if key in ("properties", "$defs"):
                for sub in value.values():
                    _keywords(sub, found)
            elif key not in ("enum", "const", "required", "description", "title"):
                _keywords(value, found)
    elif isinstance(schema, list):
        for item in schema:
            _keywords(item, found)
    return found


def test_the_schemas_report_and_diff_read_use_only_keywords_both_drafts_share():
    for command in ("memory", "analyze", "oom", "preflight", "serve"):
        assert _keywords(schemas.schema(command), set()) <= SHARED_KEYWORDS, command


def test_the_readers_check_agrees_with_jsonschema_on_damaged_documents():
    """Every golden document, damaged 150 times each (the fuzzer's JSON mutations, seeded): the readers' check
    (tpuprof.documents, fastjsonschema) refuses exactly those jsonschema finds an error in, against the same schema."""
    import random
    import sys

    sys.path.insert(0, str(ROOT / "tests" / "fuzz"))
    from mutators import _paths, mutate_json

    from tpuprof import documents
    from tpuprof.errors import UserError

    refused = passed = 0
    for command, kind in READ.items():
        reader_schema = documents._inline(schemas.schema(command))
        reference = Draft202012Validator(reader_schema)
        for path in sorted((GOLDEN / command).glob("*.json")):
            original = path.read_text()
            rng = random.Random(path.name)
            for _ in range(150):
                document = json.loads(original)
                for _ in range(rng.randint(1, 2)):
                    document = mutate_json(rng, document, _paths(document))
                if isinstance(document, dict):
                    document = {**document, "schema": schemas.name(command)}
                errors = list(reference.iter_errors(document))
                try:
                    documents.check(document, kind, str(path))
                except UserError as error:
                    assert errors, f"{path.name}: the reader refused what jsonschema passes: {error}"
                    assert str(error).count(".") >= 2 and f"{kind}" in str(error)
                    refused += 1
                else:
                    assert not errors, f"{path.name}: jsonschema finds {errors[0].message[:200]} the reader passed"
                    passed += 1
    assert refused > 300 and passed > 300, (refused, passed)  # both verdicts were put to the test


@pytest.mark.parametrize("command, edit, said", [
    # Beyond int64, named (the fields the readers take as sizes have the schema's int64 maximum).
    ("memory", lambda d: d["modules"][0].update(peak_heap_bytes=2**63),
     "memory.modules[0].peak_heap_bytes should be a non-negative integer up to 9223372036854775807"),
    # Preflight's memory module is memory.schema.json's: a figure added there is checked here too.
    ("preflight", lambda d: d["targets"][0]["memory"].update(allocated_bytes=-1),
     "preflight.targets[0].memory.allocated_bytes should be a non-negative integer, not the number -1"),
    ("oom", lambda d: d.update(dump={"module": "m", "argument_bytes": 1, "temp_bytes": 1, "output_bytes": 1,
                                     "buffers": [{"instruction": "x", "shape": "f32[2]", "size_bytes": True,
                                                  "unpadded_bytes": 8}]}),
     "oom.dump.buffers[0].size_bytes should be a non-negative integer, not a boolean"),
    ("analyze", lambda d: d.update(stragglers=[{"host": "h", "hosts_median_ms": 1.0}]),
     "steps.stragglers[0].median_ms is missing"),
])
def test_a_document_that_breaks_its_schema_is_one_sentence_naming_the_field(tmp_path, command, edit, said):
    path = sorted((GOLDEN / command).glob("*.json"))[0]
    document = json.loads(path.read_text())
    edit(document)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(document))
    done = run_cli("report", str(bad), "-o", str(tmp_path / "page.html"))
    assert done.returncode == 2 and done.stdout == "", done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"tpuprof: {bad} is not a usable tpuprof "), done.stderr
    assert said in lines[0]


def test_what_the_schema_allows_the_readers_read(saved, tmp_path):
    """Fields no schema names, a value a newer tpuprof may add to an enum, and a whole number written 3.0 (an
    integer to JSON Schema) all load: the page is drawn and diff compares."""
    document = json.loads(saved["diff_b64"].read_text())
    module = document["modules"][0]
    document["written_by"] = {"tool": "a newer tpuprof", "fields": [1, 2]}
    module["a_new_figure_bytes"] = 5
    module["method"] = "a_method_this_tpuprof_does_not_know"
    module["buffers"][0]["size_bytes"] = float(module["buffers"][0]["size_bytes"])
    path = tmp_path / "newer.json"
    path.write_text(json.dumps(document))
    assert json.loads(path.read_text())["modules"][0]["buffers"][0]["size_bytes"] == module["buffers"][0]["size_bytes"]
    assert ".0," in path.read_text()
    page = cli_json(["report", str(path), "-o", str(tmp_path / "page.html")])
    assert page["inputs"] == [{"path": str(path), "kind": "memory"}]
    compared = cli_json(["diff", str(path), str(saved["diff_b64"])])
    assert compared["kind"] == "memory" and compared["a"]["from_json"] is True


def test_the_schema_cache_keeps_only_the_current_schemas_checks(tmp_path, monkeypatch):
    """Each compiled check is keyed by its schema: one written for an older schema was never deleted, and the cache
    grew by one file a command per schema change."""
    from tpuprof import documents

    folder = tmp_path / "tpuprof" / "schemas"
    folder.mkdir(parents=True)
    stale = folder / "memory-0123456789abcdef.marshal"
    others = [folder / "oom-0123456789abcdef.marshal", folder / "memory-notes.txt"]
    for path in (stale, *others):
        path.write_bytes(b"old")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    documents._compiled.cache_clear()
    try:
        documents._compiled("memory")
    finally:
        documents._compiled.cache_clear()
    kept = sorted(p.name for p in folder.iterdir())
    assert not stale.exists() and all(p.exists() for p in others)  # another command's, and no check at all
    (current,) = [name for name in kept if name.startswith("memory-") and name.endswith(".marshal")]
    assert current != stale.name
