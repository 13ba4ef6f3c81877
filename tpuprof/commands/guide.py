"""`tpuprof guide`: the guide for agents shipped in the package (tpuprof/guide.md), printed as written."""

from __future__ import annotations

import sys
from importlib import resources


def text() -> str:
    return resources.files("tpuprof").joinpath("guide.md").read_text(encoding="utf-8")


def run() -> None:
    sys.stdout.write(text())
    sys.stdout.flush()
