"""Headless Chromium (the Debian package) for the report tests: the page's DOM after its scripts ran,
every console message it printed, and a screenshot.

Chromium with `--enable-logging=stderr` writes each console message (console.log/error, uncaught
exceptions) as an `INFO:CONSOLE` line on stderr, without its level: a clean page prints none, so
any such line counts as an error.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars")
CONSOLE = re.compile(r":CONSOLE[:(]\d+\)?\]\s*(.*)")


@dataclass
class PageLoad:
    dom: str
    console: list[str]
    screenshot: Path | None


def chromium() -> str | None:
    for path in CANDIDATES:
        if Path(path).exists():
            return path
    return shutil.which("chromium")


def _run(binary: str, page: Path, extra: list[str], profile: Path, timeout: float) -> subprocess.CompletedProcess:
    command = [binary, *FLAGS, f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
               # Virtual time runs the page's scripts and plotly's rendering to completion before dumping.
               "--virtual-time-budget=10000", *extra, page.resolve().as_uri()]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


def load(page: Path, screenshot: Path | None = None, width: int = 1280, height: int = 4000,
         timeout: float = 60) -> PageLoad:
    binary = chromium()
    if binary is None:
        raise RuntimeError("chromium is not installed")
    with tempfile.TemporaryDirectory(prefix="tpuprof-chromium-") as profile:
        done = _run(binary, page, ["--dump-dom"], Path(profile) / "dom", timeout)
        if done.returncode != 0:
            raise RuntimeError(f"chromium exited with {done.returncode}: {done.stderr[-2000:]}")
        console = [m.group(1) for m in CONSOLE.finditer(done.stderr)]
        if screenshot is not None:
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            shot = _run(binary, page, [f"--screenshot={screenshot.resolve()}", f"--window-size={width},{height}"],
                        Path(profile) / "shot", timeout)
            console += [m.group(1) for m in CONSOLE.finditer(shot.stderr)]
            if shot.returncode != 0 or not screenshot.exists():
                raise RuntimeError(f"chromium took no screenshot: {shot.stderr[-2000:]}")
    return PageLoad(done.stdout, console, screenshot)
