"""Every sample's --json document equals its checked-in golden copy (tests/golden/): numbers and suggestions.

A failure lists the figures that moved. If the change is intended, run `make golden` and commit the reviewed
diff of tests/golden/ with the change that caused it.
"""

from __future__ import annotations

import pytest

from helpers import golden
from helpers.sample_documents import commands, document


@pytest.mark.parametrize("sample", commands(), ids=lambda c: c[0])
def test_sample_document_equals_its_golden_copy(sample):
    sample_id = sample[0]
    actual = golden.normalise(document(sample))
    if golden.UPDATE:
        golden.write(sample_id, actual)
        return
    expected = golden.read(sample_id)
    assert expected is not None, f"no golden copy for {sample_id}: run `make golden` and review tests/golden/"
    moved = golden.differences(expected, actual)
    assert not moved, (f"{len(moved)} figure(s) of {sample_id} moved (run `make golden` if intended):\n"
                       + "\n".join(moved[:25]))


def test_a_moved_figure_is_reported():
    """The comparison can fail: a changed peak, a removed suggestion and an added key are each named."""
    expected = {"modules": [{"peak_heap_bytes": 100, "suggestions": [{"kind": "padding"}]}]}
    actual = {"modules": [{"peak_heap_bytes": 101, "suggestions": [], "method": "x"}]}
    moved = golden.differences(expected, actual)
    assert "/modules[0]/peak_heap_bytes: 100 -> 101" in moved
    assert "/modules[0]/suggestions: 1 -> 0 items" in moved
    assert any(line.startswith("/modules[0]/method: added") for line in moved)


def test_machine_dependent_values_are_normalised():
    document = {"source_line": f"{golden.ROOT}/sample_profiles/models/conv18.py:30", "cached": True,
                "ratio": 1.23456789}
    assert golden.normalise(document) == {"source_line": "<repo>/sample_profiles/models/conv18.py:30",
                                          "cached": "<volatile>", "ratio": 1.23457}
