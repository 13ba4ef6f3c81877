"""One rounding of a document's millisecond figures for every place that shows them: the report page's saving
badge printed "up to 30.41 ms" (f"{30.415:.2f}") where the page's breakdown table printed 30.42 for the same
figure."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tpuprof.presentation import analyze as analyze_section
from tpuprof.renderers import html
from tpuprof.sources.inputs import STEPS, Input
from tpuprof.units import fmt_fixed

GOLDEN = Path(__file__).resolve().parent / "golden" / "analyze"


def test_halves_round_up_as_the_figure_they_round():
    # 30.415 and 2.925 are stored a hair below the half: a float's own rounding takes them down.
    assert f"{30.415:.2f}" == "30.41" and fmt_fixed(30.415, 2) == "30.42"
    assert fmt_fixed(2.925, 2) == "2.93" and analyze_section._num(2.925, 2) == "2.93"


def test_what_is_not_a_finite_figure_prints_as_python_prints_it():
    # Decimal raised InvalidOperation quantizing an infinity (a ratio over a zero).
    assert [fmt_fixed(v, 2) for v in (float("inf"), float("-inf"), float("nan"))] == ["inf", "-inf", "nan"]


def test_the_pages_saving_badge_is_the_breakdown_tables_figure():
    # tf_slow_map: a real capture's document (a tf.data map sleeping 2 ms per example): the input-pipeline fix
    # can win the step's whole input time.
    document = json.loads((GOLDEN / "tf_slow_map.json").read_text())
    page = html.render([Input(str(GOLDEN / "tf_slow_map.json"), STEPS, document, from_json=True)])
    badges = re.findall(r"up to ([\d.]+) ms per step", page)
    assert badges == [fmt_fixed(document["breakdown_ms_per_step"]["input"], 2)]
    assert f">{badges[0]}<" in page  # the breakdown table's cell shows the same figure
