"""The presentation model (tpuprof/presentation) and its printers: one section per document, drawn by the terminal,
Markdown, the report page and the notebook with the same facts. Serve first: `tpuprof report serve.json` and
`tpuprof.report([tpuprof.serve(...)])` draw a serve section; a bad serve document is one sentence."""

from __future__ import annotations

import html
import json
import re

import pytest

import tpuprof

from conftest import SAMPLES, run_cli
from tpuprof.units import fmt_ms, tenths_down

SERVE = ["serve", "--model", "llama3.1-70b", "--tpu", "v6e-8,v5p-16,v5e-8", "--max-model-len", "8192",
         "--concurrency", "64", "--no-compile"]


@pytest.fixture(scope="module")
def serve_json(tmp_path_factory):
    """A real `tpuprof serve --no-compile --json` document, saved as a user would."""
    done = run_cli(*SERVE, "--json")
    assert done.returncode == 0, done.stderr
    path = tmp_path_factory.mktemp("serve") / "serve.json"
    path.write_text(done.stdout)
    return path


def _text(page: str) -> str:
    """The page's visible text, one space between words (the figures as a reader sees them)."""
    body = re.sub(r"<script.*?</script>", "", page, flags=re.S)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", body)))


def test_report_draws_a_serve_section_from_a_saved_document(serve_json, tmp_path):
    page_path = tmp_path / "page.html"
    done = run_cli("report", serve_json, "-o", page_path, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["inputs"] == [{"path": str(serve_json), "kind": "serve"}]
    page = _text(page_path.read_text())
    document = json.loads(serve_json.read_text())
    assert len(document["targets"]) == 3
    assert [t["fits"] for t in document["targets"]] == [True, True, False]  # v5e-8 is too small for 70B
    for t in document["targets"]:
        figures = [t["slice"]["name"], t["verdict"], f"{t['kv_cache_tokens']:,}", tenths_down(t["max_concurrency"]),
                   f"{t['kv_bytes_per_token_per_device']:,} B", f"{t['gpu_memory_utilization']:.2f}", t["command"]]
        e = t["estimate"]
        if t["fits"]:
            p = e["prefill_ms"]
            figures += [f"TPOT {fmt_ms(e['tpot_ms'])} ({fmt_ms(e['tpot_ms_low'])} to {fmt_ms(e['tpot_ms_high'])})",
                        f"TTFT {fmt_ms(e['ttft_ms'])} (prefill chunk {fmt_ms(p['point'])}, {fmt_ms(p['low'])} to "
                        f"{fmt_ms(p['high'])})", f"{e['output_tokens_per_s']:,.0f} output tokens/s",
                        f"${e['cost_per_million_output_tokens']:,.3f}"]
        for figure in figures:
            assert figure in page, figure
    assert f"fastest first: {', '.join(document['ranking']['speed'])}" in page


def test_terminal_markdown_and_page_print_the_same_facts(serve_json, tmp_path):
    """Every fact, verdict and launch command of the section is in all three outputs: one wording."""
    from tpuprof.presentation import Command, Fact, Verdict, build
    from tpuprof.renderers.markdown import render

    document = json.loads(serve_json.read_text())
    section = build(document)
    facts = [b for s in [section, *section.sections] for b in s.blocks if isinstance(b, (Fact, Verdict, Command))]
    assert len(facts) >= 3 * 5
    terminal = re.sub(r"\s+", " ", run_cli(*SERVE, env={"COLUMNS": "400"}).stdout)
    markdown = re.sub(r"\s+", " ", render(document).replace("**", ""))
    run_cli("report", serve_json, "-o", tmp_path / "page.html")
    page = _text((tmp_path / "page.html").read_text())
    for block in facts:
        said = block.text if isinstance(block, (Verdict, Command)) else block.value
        for name, output in (("terminal", terminal), ("markdown", markdown), ("page", page)):
            assert said in output, (name, said)


def test_report_of_an_api_serve_result(tmp_path):
    import tpuprof

    result = tpuprof.serve("llama3.1-8b", "v6e-4", max_model_len=4096, compile=False)
    page = tmp_path / "page.html"
    written = tpuprof.report([result], page)
    assert [i.kind for i in written.inputs] == ["serve"]
    text = _text(page.read_text())
    assert result.to_dict()["targets"][0]["command"] in text and "v6e-4" in text
    assert "vllm serve" in result._repr_html_()  # the notebook cell: the same section, without plots


@pytest.mark.parametrize("edit, field", [
    (lambda d: d["targets"][0].update(kv_cache_tokens="many"), "targets[0].kv_cache_tokens"),
    (lambda d: d["targets"][1].pop("command"), "targets[1].command is missing"),
    (lambda d: d["targets"][0]["estimate"].update(tpot_ms=-1), "targets[0].estimate.tpot_ms"),
    (lambda d: d.update(schema="tpuprof.serve/2"), "newer than this tpuprof reads (tpuprof.serve/1)"),
])
def test_an_edited_serve_document_is_one_sentence(serve_json, tmp_path, edit, field):
    document = json.loads(serve_json.read_text())
    edit(document)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(document))
    page = tmp_path / "page.html"
    done = run_cli("report", bad, "-o", page)
    assert done.returncode == 2 and done.stdout == "" and "Traceback" not in done.stderr
    assert field in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not page.exists()


def test_diff_of_serve_documents_points_at_report(serve_json):
    done = run_cli("diff", serve_json, serve_json)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "`tpuprof report" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_memory_terminal_markdown_page_and_notebook_say_the_same_facts(tmp_path):
    """The memory section of a real dump: its verdict, method, facts and table rows in every printer."""
    from conftest import DUMPS
    from tpuprof.presentation import Fact, Note, Table, Verdict
    from tpuprof.presentation.memory import section
    from tpuprof.renderers.markdown import render

    dump = DUMPS / "conv18_f32_v5e"
    document = json.loads(run_cli("memory", dump, "--json").stdout)
    shown = section(document, top=5)
    blocks = [b for s in shown.sections for b in s.blocks]
    said = [b.text if isinstance(b, (Verdict, Note)) else b.value for b in blocks if isinstance(b, (Fact, Verdict, Note))]
    assert any(isinstance(b, Verdict) and b.fits for b in blocks) and len(said) >= 8
    instructions = [row[0] for b in blocks if isinstance(b, Table) and b.title.startswith("Largest") for row in b.rows]
    assert len(instructions) == 5
    terminal = re.sub(r"\s+", " ", run_cli("memory", dump, "--top", "5", env={"COLUMNS": "400"}).stdout)
    markdown = re.sub(r"\s+", " ", render(document).replace("**", ""))
    run_cli("report", dump, "-o", tmp_path / "page.html")
    page = _text((tmp_path / "page.html").read_text())
    notebook = _text(tpuprof.memory(dump)._repr_html_())
    for name, output in (("terminal", terminal), ("markdown", markdown), ("page", page), ("notebook", notebook)):
        missing = [fact for fact in said if fact not in output]
        assert not missing, (name, missing)
        if name != "page":  # the page lists the padded buffers instead, each with its chart and fix
            assert all(i in output for i in instructions), name


def test_oom_terminal_markdown_page_and_notebook_say_the_same_facts(tmp_path):
    """A real libtpu OOM log: its headline, facts, figures and allocations in every printer, in tpuprof's units."""
    from conftest import SAMPLES
    from tpuprof.presentation import Fact, Table, Verdict
    from tpuprof.presentation.oom import section
    from tpuprof.renderers.markdown import render

    log = SAMPLES / "oom" / "libtpu_transformer_v5e.txt"
    document = json.loads(run_cli("oom", log, "--json").stdout)
    shown = section(document)
    said = [b.text if isinstance(b, Verdict) else b.value for b in shown.blocks if isinstance(b, (Fact, Verdict))]
    cells = [c for b in shown.blocks if isinstance(b, Table) for row in b.rows[:5] for c in row[:2] if c]
    assert len(said) >= 3 and any(c.endswith("iB") for c in cells)
    terminal = re.sub(r"\s+", " ", run_cli("oom", log, env={"COLUMNS": "400"}).stdout)
    markdown = re.sub(r"\s+", " ", render(document, top=30).replace("**", ""))
    run_cli("report", log, "-o", tmp_path / "page.html")
    page = _text((tmp_path / "page.html").read_text())
    notebook = _text(tpuprof.oom(str(log))._repr_html_())
    for name, output in (("terminal", terminal), ("markdown", markdown), ("page", page), ("notebook", notebook)):
        missing = [fact for fact in said + cells if fact not in output]
        assert not missing, (name, missing)


# Serve's compiled Gemma 3 1B on v5e-1 (session fixture of test_serve.py: compiled once per run, on disk after).
from test_serve import gemma3_1b_keras_config, gemma3_1b_v5e, needs_libtpu  # noqa: E402,F401


@needs_libtpu
def test_a_compiled_plan_shows_its_programs_and_safe_utilization(gemma3_1b_v5e, tmp_path):  # noqa: F811
    """What only compiles give: the engine's program count and the largest safe utilization, in every printer."""
    from tpuprof.presentation import build
    from tpuprof.renderers.markdown import render
    from tpuprof.renderers.printers import html, markdown

    document = gemma3_1b_v5e.to_dict()
    t = document["targets"][0]
    count, safe = t["programs"]["count"], t["safe_gpu_memory_utilization"]
    assert count > 0 and safe is not None
    section = build(document)
    table = section.blocks[1]
    assert table.rows[0][[c.header for c in table.columns].index("programs")] == f"{count:,}"
    assert f"{t['gpu_memory_utilization']:.2f} (safe ≤ {safe:.2f})" in table.rows[0]
    said = f"the engine compiles {count} at start-up"
    page = tmp_path / "page.html"
    tpuprof.report([gemma3_1b_v5e], page)
    for output in (render(document), "\n".join(markdown(section)), html(section), _text(page.read_text())):
        assert said in output and f"safe --gpu-memory-utilization {safe}" in output


def _report_refuses(tmp_path, document: dict, field: str) -> None:
    """`tpuprof report` of the edited DOCUMENT: one sentence naming FIELD, exit 2, no page."""
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(document))
    page = tmp_path / "page.html"
    done = run_cli("report", bad, "-o", page)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert field in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not page.exists()


@pytest.mark.parametrize("edit, field", [
    (lambda d: d.update(framework={"name": "jax"}), "oom.framework"),
    (lambda d: d.update(largest_free_bytes=[1]), "oom.largest_free_bytes"),
    (lambda d: d.update(serving={"engine": "vllm", "cause": "program_load", "settings": {"max_concurrency": [1]}}),
     "oom.serving.settings.max_concurrency"),
    (lambda d: d.update(dump={"module": "m"}), "oom.dump.argument_bytes is missing"),
])
def test_an_edited_oom_document_is_one_sentence(tmp_path, edit, field):
    """Every field the oom section prints is checked when the document is read back (the fuzz run found four
    that reached the page unchecked)."""
    document = json.loads(run_cli("oom", SAMPLES / "oom" / "libtpu_transformer_v5e.txt", "--json").stdout)
    edit(document)
    _report_refuses(tmp_path, document, field)


def _facts(section) -> list[str]:
    """A section's sentences and figures as a reader sees them (code spans' backticks aside), sub-sections too."""
    from tpuprof.presentation import Fact, Note, Verdict

    blocks = section.blocks + [b for s in section.sections for b in s.blocks]
    said = [b.value if isinstance(b, Fact) else b.text for b in blocks if isinstance(b, (Fact, Verdict, Note))]
    return [s.replace("`", "") for s in said]


def _cells(section, rows: int, columns: int) -> list[str]:
    from tpuprof.presentation import Table

    blocks = section.blocks + [b for s in section.sections for b in s.blocks]
    return [c for b in blocks if isinstance(b, Table) for row in b.rows[:rows] for c in row[:columns] if c]


def _plain(text: str) -> str:
    return re.sub(r"\s+", " ", text.replace("**", "").replace("`", "").replace("\\|", "|"))


def test_analyze_terminal_markdown_page_and_notebook_say_the_same_facts(tmp_path):
    """A real two-host capture: the run, the hosts, the steps, the verdict, the straggler and the pod, and the rows of
    the breakdown, the ops and the pod table, in every printer."""
    from tpuprof.presentation.analyze import section
    from tpuprof.renderers.markdown import render

    capture = SAMPLES / "captures" / "jax_two_hosts_straggler"
    document = json.loads(run_cli("analyze", capture, "--json").stdout)
    shown = section(document, top=5)
    said, cells = _facts(shown), _cells(shown, 5, 2)
    assert any(s.startswith("highly input-bound. 80.3% of step time waiting for input") for s in said)
    assert any(s.startswith("Straggler: localhost_54739 median step 23.10 ms") for s in said)
    assert "waiting for input" in cells and "localhost_54739" in cells and "ynn_fusion.5" in cells
    terminal = _plain(run_cli("analyze", capture, "--top", "5", env={"COLUMNS": "400"}).stdout)
    markdown = _plain(render(document))
    run_cli("report", capture, "-o", tmp_path / "page.html")
    page = _text((tmp_path / "page.html").read_text())
    notebook = _text(tpuprof.analyze(str(capture))._repr_html_())
    for name, output in (("terminal", terminal), ("markdown", markdown), ("page", page), ("notebook", notebook)):
        missing = [fact for fact in said + cells if fact not in output]
        assert not missing, (name, missing)


def test_diff_terminal_markdown_and_notebook_say_the_same_facts():
    """Two real dumps (batch 64 and 128): the tripped threshold with the figure it compared, the metrics, the growth
    per example and the buffers that changed, in every printer; the worse rows are marked as worse."""
    from conftest import DUMPS
    from tpuprof.presentation.diff import section
    from tpuprof.renderers.markdown import render

    a, b = DUMPS / "diff_b64", DUMPS / "diff_b128"
    args = ("diff", a, b, "--fail-if", "peak_heap_bytes>+5%")
    document = json.loads(run_cli(*args, "--json").stdout)
    shown = section(document, top=5)
    said, cells = _facts(shown), _cells(shown, 5, 5)
    assert "FAIL --fail-if peak_heap_bytes>+5% (jit_train_step): peak_heap_bytes +99.0%." in said
    assert any(s.startswith("Per example: +18.50 MiB of peak HBM per example") for s in said)
    assert "peak_heap_bytes" in cells and "+99.0%" in cells and "fusion.107{1}" in cells
    done = run_cli(*args, env={"COLUMNS": "400"})
    assert done.returncode == 1
    terminal, markdown = _plain(done.stdout), _plain(render(document))
    result = tpuprof.diff(str(a), str(b), fail_if=["peak_heap_bytes>+5%"])
    notebook = _text(result._repr_html_())
    for name, output in (("terminal", terminal), ("markdown", markdown), ("notebook", notebook)):
        missing = [fact for fact in said + cells if fact not in output]
        assert not missing, (name, missing)
    peak_row = re.search(r'<tr class="(\w+)"><td><span class="mono">peak_heap_bytes<', result._repr_html_())
    assert peak_row and peak_row.group(1) == "oom"  # a larger peak is worse


@pytest.mark.parametrize("edit, field", [
    (lambda d: d.update(stragglers=[{"host": "h", "median_ms": "slow", "hosts_median_ms": 1.0}]),
     "steps.stragglers[0].median_ms"),
    (lambda d: d.update(duty_cycle={"percent": 50.0}), "steps.duty_cycle.op_ms_per_chip is missing"),
])
def test_an_edited_analyze_document_is_one_sentence(tmp_path, edit, field):
    """The figures the analyze section prints from a saved document are checked when it is read back."""
    document = json.loads(run_cli("analyze", SAMPLES / "captures" / "jax_two_hosts_straggler", "--json").stdout)
    edit(document)
    _report_refuses(tmp_path, document, field)


@pytest.mark.parametrize("name", ["mlp_factory_bf16", "mlp_too_large"])
def test_preflight_terminal_markdown_page_and_notebook_say_the_same_facts(name, tmp_path, capsys, monkeypatch):
    """A real preflight document (checked-in golden: one that fits with its step estimate, bf16 comparison and
    compiled memory; one the compiler refused): the verdict, every figure of the side-by-side tables, the slowest
    ops, which TPU, the refusal and the compile's memory, in every printer."""
    from conftest import ROOT
    from tpuprof.presentation.preflight import section
    from tpuprof.presentation import Table
    from tpuprof.renderers import notebook
    from tpuprof.renderers.markdown import render
    from tpuprof.renderers.preflight import print_document

    saved = ROOT / "tests" / "golden" / "preflight" / f"{name}.json"
    document = json.loads(saved.read_text())
    shown = section(document, top=5)
    said = _facts(shown) + [fact for memory in shown.sections for fact in _facts(memory)]  # a compile's module
    cells = [c.strip() for b in shown.blocks if isinstance(b, Table) for row in b.rows for c in row if c.strip()]
    target = document["targets"][0]
    if target["fits"]:
        assert "fits (2% of HBM, 15.51 GiB spare)" in said and any(s.startswith("cheapest that fits: v5e") for s in said)
        assert "245.29 MiB" in cells and "3.27 ms (2.66-4.02 ms)" in cells and "94.10 MiB" in cells  # bf16
        assert any(s.startswith("jit(_step)/jvp()/dot_general (mlp.py:22)") for s in said)  # the slowest ops
    else:
        assert "does not fit (the compiler refused it: RESOURCE_EXHAUSTED)" in said
        assert any("the compiler ran out of memory at batch 8: RESOURCE_EXHAUSTED" in s for s in said)
    monkeypatch.setenv("COLUMNS", "400")
    print_document(document, 5)
    terminal = _plain(capsys.readouterr().out)
    markdown = _plain(render(document))
    run_cli("report", saved, "-o", tmp_path / "page.html")
    page = _text((tmp_path / "page.html").read_text())
    cell = _text(notebook._preflight(document))  # the notebook cell's body (a result would compile again)
    for printed, output in (("terminal", terminal), ("markdown", markdown), ("page", page), ("notebook", cell)):
        missing = [fact for fact in said + cells if fact.replace("`", "") not in output]
        assert not missing, (printed, missing)
