"""Golden --json documents: every sample's document, checked in under tests/golden/, so that a change in any
figure or suggestion shows up as a reviewed diff of a JSON file.

`make golden` (or `TPUPROF_UPDATE_GOLDEN=1 pytest tests/test_golden.py`) rewrites them from the current code;
review `git diff tests/golden` before committing. What depends on the machine rather than on tpuprof (the
clone's absolute path in source lines, a compile's wall time, cache hits, temporary dump folders) is
normalised first, so the files are the same on every clone.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

from helpers.paths import ROOT

GOLDEN = ROOT / "tests" / "golden"
UPDATE = os.environ.get("TPUPROF_UPDATE_GOLDEN") == "1"

# Keys whose values say how or where a document was made, not what tpuprof found.
VOLATILE_KEYS = {"cached", "cache", "dump_dir", "compile_seconds", "seconds", "elapsed_seconds", "wall_seconds"}
# Compile caches and dumps of this run: tpuprof-* folders in the temporary folder, or in the run's own folder
# there (helpers.sample_documents, which xdist's workers share).
TEMPORARY = re.compile(re.escape(tempfile.gettempdir()) + r"/(?:pytest-of-[^/]+/pytest-\d+/)?tpuprof-[^/]+/")
CHECKOUT = re.compile(r"(?:/[\w.+-]+)+/(?=(?:sample_profiles|tpuprof|tests|bench|\.venv)/)")
SIGNIFICANT_DIGITS = 6  # floats are compared to this precision (the renderers print 3-4)


def path_for(sample_id: str) -> Path:
    return GOLDEN / f"{sample_id}.json"


def normalise(value, key: str | None = None):
    """The document as it is checked in: machine-dependent values replaced, floats rounded."""
    if isinstance(value, dict):
        return {k: ("<volatile>" if k in VOLATILE_KEYS else normalise(v, k)) for k, v in value.items()}
    if isinstance(value, list):
        return [normalise(v, key) for v in value]
    if isinstance(value, str):
        value = TEMPORARY.sub("<tmp>/", value)  # compile caches and dumps of this run
        # Source lines name the clone the samples were generated in (their dumps keep it), or this one.
        value = CHECKOUT.sub("<repo>/", value.replace(str(ROOT), "<repo>"))
        return value.replace(os.path.expanduser("~"), "<home>")
    if isinstance(value, float):
        return float(f"{value:.{SIGNIFICANT_DIGITS}g}")
    return value


def differences(expected, actual, path: str = "") -> list[str]:
    """Where two normalised documents differ, as 'path: expected -> actual' lines."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        found = []
        for key in list(expected) + [k for k in actual if k not in expected]:
            if key not in actual:
                found.append(f"{path}/{key}: removed")
            elif key not in expected:
                found.append(f"{path}/{key}: added {json.dumps(actual[key])[:80]}")
            else:
                found += differences(expected[key], actual[key], f"{path}/{key}")
        return found
    if isinstance(expected, list) and isinstance(actual, list):
        found = [f"{path}: {len(expected)} -> {len(actual)} items"] if len(expected) != len(actual) else []
        for index, (a, b) in enumerate(zip(expected, actual)):
            found += differences(a, b, f"{path}[{index}]")
        return found
    if expected != actual:
        return [f"{path}: {json.dumps(expected)[:80]} -> {json.dumps(actual)[:80]}"]
    return []


def write(sample_id: str, document: dict) -> None:
    target = path_for(sample_id)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(normalise(document), indent=1, sort_keys=False) + "\n")


def read(sample_id: str) -> dict | None:
    target = path_for(sample_id)
    return json.loads(target.read_text()) if target.exists() else None
