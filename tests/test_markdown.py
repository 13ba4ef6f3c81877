"""`--format markdown`: every sample's Markdown shows its --json document's figures, and a Markdown parser builds
its tables (what GitHub renders in a PR comment or a job summary)."""

from __future__ import annotations

import json

import pytest
from markdown_it import MarkdownIt

from conftest import SAMPLES, run_cli
from helpers.sample_documents import commands, document
from tpuprof.renderers import markdown
from tpuprof.presentation.diff import fmt_change, fmt_value
from tpuprof.units import fmt_bytes, fmt_ms

PARSER = MarkdownIt("commonmark").enable("table")


def tables(text: str) -> list[list[list[str]]]:
    """The tables a Markdown parser builds: each a list of rows (header first) of cell texts."""
    found, row, in_cell = [], None, False
    for token in PARSER.parse(text):
        if token.type == "table_open":
            found.append([])
        elif token.type == "tr_open":
            row = []
        elif token.type == "tr_close":
            found[-1].append(row)
        elif token.type in ("th_open", "td_open"):
            in_cell = True
        elif token.type in ("th_close", "td_close"):
            in_cell = False
        elif token.type == "inline" and in_cell:
            row.append("".join(child.content for child in token.children or []) if token.children else token.content)
    return found


def expected_figures(doc: dict) -> list[str]:
    """The figures of the document the Markdown must show, formatted independently of the renderer's layout."""
    command = doc["schema"].split(".")[1].split("/")[0]
    out: list[str] = []
    if command == "memory":
        ranked = sorted(doc["modules"], key=lambda m: m.get("peak_heap_bytes") or 0, reverse=True)
        for module in ranked[:markdown.MAX_MODULES]:
            out += [module["name"], fmt_bytes(module["peak_heap_bytes"]), fmt_bytes(module["padding_at_peak_bytes"])]
            out += [fmt_bytes(b["size_bytes"]) for b in module["buffers"][:markdown.TOP]]
            out += [b["instruction"] for b in module["buffers"][:markdown.TOP]]
            out += [s["message"] for s in module["suggestions"][:markdown.MAX_FIXES]]
            out += module["caveats"]
    elif command == "analyze":
        out += [doc["verdict"], f"median {doc['steps']['median_ms']:.2f} ms", str(doc["steps"]["count"])]
        out += [str(v) for v in doc["breakdown_percent"].values() if v]
        out += [o["name"] for o in doc["top_ops"][:markdown.TOP]]
        out += [s["message"] for s in doc["suggestions"][:markdown.MAX_FIXES]] + doc["caveats"] + doc["warnings"]
    elif command == "oom":
        out += [doc["headline"], fmt_bytes(doc["capacity_bytes"])]
        out += [s["message"] for s in doc["suggestions"][:markdown.MAX_FIXES]] + doc["batch_estimate"]["caveats"]
        if doc["batch_estimate"].get("fitting_batch") is not None:
            out.append(f"batch that fits**: {doc['batch_estimate']['fitting_batch'] or 'none, not even 1'} (now")
    elif command == "preflight":
        for target in doc["targets"]:
            out += [target["target"], "fits" if target["fits"] else "does not fit"]
            if target["required_bytes"] is not None:  # else the verdict says the compiler refused it
                out.append(fmt_bytes(target["required_bytes"]))
            if target.get("estimate"):
                out += [fmt_ms(target["estimate"]["step_ms"])] + target["estimate"]["caveats"]
            if target.get("memory"):
                out += [fmt_bytes(target["memory"]["peak_heap_bytes"])] + target["memory"]["caveats"]
    elif command == "diff":
        out += [c["expression"] for c in doc["thresholds"]]
        for group in doc["groups"]:
            out += group["caveats"]
            for m in group["metrics"]:
                if m["change"]:
                    out += [m["name"], fmt_value(m["b"], m["unit"]), fmt_change(m["change"], m["unit"])]
    return out


def _unescaped(text: str) -> str:
    return text.replace("\\|", "|")


@pytest.mark.parametrize("sample", commands(), ids=lambda c: c[0])
def test_markdown_shows_the_json_figures(sample):
    doc = document(sample)
    text = markdown.render(doc)
    plain = _unescaped(text)
    missing = [figure for figure in expected_figures(doc) if figure not in plain]
    assert not missing, f"{sample[0]}: the Markdown lacks {missing[:5]}"
    built = tables(text)
    assert built, f"{sample[0]}: no table was built"
    assert all(len(row) == len(t[0]) for t in built for row in t), "a row with a different number of cells"
    assert len(text) < 12_000, "too long for a PR comment"


def test_the_tables_hold_the_figures_in_their_cells():
    """Not only somewhere in the text: the parser puts the diff's metrics in cells; the tripped threshold is the
    verdict, then its line with the figure it compared."""
    sample = next(c for c in commands() if c[0] == "diff/memory")
    doc = document(sample)
    text = markdown.render(doc)
    assert "- ❌ FAIL --fail-if peak_heap_bytes>+5% (jit_train_step): peak_heap_bytes +99.0%." in text
    built = tables(text)
    metrics = {row[0]: row for row in built[0][1:]}
    peak = next(m for m in doc["groups"][0]["metrics"] if m["name"] == "peak_heap_bytes")
    assert metrics["peak_heap_bytes"][1:3] == [fmt_bytes(peak["a"]), fmt_bytes(peak["b"])]


def test_a_pipe_in_a_name_stays_in_its_cell():
    doc = {"schema": "tpuprof.analyze/1", "verdict": "compute-bound", "steps": {"count": 9, "median_ms": 1.0},
           "breakdown_percent": {"compute": 100.0}, "breakdown_ms_per_step": {"compute": 1.0},
           "top_ops": [{"name": "a|b`c", "kind": "k", "where": "TPU", "count": 1, "self_ms": 2.0}]}
    ops = tables(markdown.render(doc))[1]
    assert ops[0] == ["op", "type", "count", "self ms"] and ops[1] == ["a|b`c", "k", "1", "2.00"]


def test_a_preflight_target_on_a_slice_is_named_by_its_slice():
    """`--tpu v6e-256,2xv6e-16,v6e:2x2`: the slice names as given, not the generation three times."""
    def target(name, topology, slices=1):
        return {"target": "v6e", "topology": topology, "batch_size": 1, "fits": True, "required_bytes": 2**30,
                "hbm_capacity_bytes": 2**35, "verdict": f"fits on {name}",
                "slice": {"name": name, "topology": topology, "chips": 16, "devices": 16, "num_slices": slices}}

    doc = {"schema": "tpuprof.preflight/1",
           "targets": [target("v6e-256", "v6e:16x16"), target("v6e-16", "v6e:4x4", 2), target("v6e:2x2", "v6e:2x2")]}
    text = markdown.render(doc)
    header = tables(text)[0][0]  # the slices side by side, each column headed by its name and topology
    assert [cell.split(" (")[0] for cell in header[1:]] == ["v6e-256", "2xv6e-16", "v6e"]
    assert "**v6e-256**: fits on v6e-256" in text and "**2xv6e-16**: fits on v6e-16" in text


def test_cli_markdown_is_the_json_document_rendered():
    """`--format markdown` prints exactly what the renderer makes of the `--json` document; diff keeps exit 1."""
    sample = next(c for c in commands() if c[0] == "diff/memory")
    result = run_cli(*sample[1], "--format", "markdown")
    assert result.returncode == 1, result.stderr
    assert result.stdout == markdown.render(document(sample))
    assert result.stdout.startswith("## tpuprof diff\n\n- ❌ **--fail-if**: regression: 1 of 1 thresholds tripped")


def test_json_and_another_format_is_one_sentence():
    result = run_cli("analyze", "sample_profiles/captures/jax_compute", "--json", "--format", "markdown")
    assert result.returncode == 2
    assert result.stderr.strip() == "tpuprof: --json and --format markdown ask for two formats: give one."


@pytest.mark.parametrize("command", ["memory", "oom", "analyze", "preflight", "diff"])
def test_a_document_missing_its_optional_parts_still_renders(command):
    """A document read back may lack lists and figures (older tpuprof, another tool): the heading, no error."""
    text = markdown.render({"schema": f"tpuprof.{command}/1"})
    assert text.startswith(f"## tpuprof {command}")


def test_a_step_fix_in_markdown_states_its_fact_and_an_upper_bound():
    """tf_slow_map (a real capture): the input-pipeline fix can win at most the step's input time (its range starts
    at 0). Markdown read 'saves ≈150.64 ms/step' with no evidence; it says 'up to' and gives the fact the fix rests
    on, as the terminal and the page do."""
    document = json.loads(run_cli("analyze", SAMPLES / "captures" / "tf_slow_map", "--json").stdout)
    advice = document["suggestions"][0]
    assert advice["kind"] == "input_pipeline" and advice["saving_ms_range"][0] == 0
    text = run_cli("analyze", SAMPLES / "captures" / "tf_slow_map", "--format", "markdown").stdout
    fix = text[text.index("**Fixes**"):]
    assert f"saves up to {advice['saving_ms_per_step']:g} ms/step" in fix and "saves ≈" not in fix
    assert f"evidence: {advice['evidence']}" in fix
    # The notebook cell said 'saves 150.6 ms per step': the same upper bound, in the same words.
    import tpuprof
    from tpuprof.renderers import notebook

    cell = notebook.render(tpuprof.analyze(str(SAMPLES / "captures" / "tf_slow_map")))
    assert f"saves up to {advice['saving_ms_per_step']:g} ms/step, estimated" in cell


def test_a_memory_fix_that_frees_a_range_says_the_range_in_every_printer(tmp_path):
    """conv18_f32_v5e: moving its 96 MiB of float32 temporaries to bfloat16 frees a quarter to a half of them (the
    document's saving_bytes_range, 24-48 MiB). Markdown read 'frees ≈48.00 MiB' (the top of the range as the
    estimate), the terminal 'frees ≈48.00 MiB (24.00 MiB-48.00 MiB)', the page 'saves ~48.00 MiB', the notebook
    'saves 48.00 MiB': one wording now, the range, in all four."""
    import tpuprof
    from tpuprof.renderers import notebook

    dump = SAMPLES / "dumps" / "conv18_f32_v5e"
    document = json.loads(run_cli("memory", dump, "--no-compile", "--json").stdout)
    (advice,) = [s for m in document["modules"] for s in m["suggestions"] if s["kind"] == "bf16"]
    low, high = advice["saving_bytes_range"]
    assert low < high == advice["saving_bytes"]
    words = f"frees {fmt_bytes(low)} to {fmt_bytes(high)}, {advice['confidence']}"
    markdown_text = run_cli("memory", dump, "--no-compile", "--format", "markdown").stdout
    terminal_text = " ".join(run_cli("memory", dump, "--no-compile").stdout.split())
    saved = tmp_path / "conv18.json"
    saved.write_text(json.dumps(document))
    page = tmp_path / "page.html"
    assert run_cli("report", saved, "-o", page).returncode == 0
    cell = notebook.render(tpuprof.memory(str(dump), compile=False))
    for text in (markdown_text, terminal_text, page.read_text(), cell):
        assert words in text and f"≈{fmt_bytes(high)}" not in text and f"~{fmt_bytes(high)}" not in text
