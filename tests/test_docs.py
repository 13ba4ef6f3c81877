"""README.md and docs/: every `tpuprof COMMAND --option` they show exists, and every link between them leads to a page.

Commands and options come from the CLI itself (tests/test_guide.py's reading of typer's click command), so a
renamed option fails here until the documentation follows, as the guide's test does for the guide."""

from __future__ import annotations

import re

from helpers.paths import ROOT
from test_guide import OPTION, cli_options

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```.*?$(.*?)^```", re.S | re.M)
CODE_SPAN = re.compile(r"`([^`\n]+)`")
INVOCATION = re.compile(r"(?<![\w./-])tpuprof(?:\s+([a-z][a-z-]*))?((?:\s+\S+)*)")
ROOT_OPTIONS = {"--help", "-h", "--version", "--install-completion", "--show-completion"}
# Commands the README announces that land with their own branch: checked as soon as the CLI has them.
ANNOUNCED = {"serve"}
# Code spans that start with tpuprof and are names, not command lines.
NAMES = {"tpuprof steps"}  # the Perfetto track `trace` writes
LINK = re.compile(r"\]\((?!https?:)([^)#\s]+\.md)(?:#[^)]*)?\)")


def invocations(text: str) -> list[str]:
    """Every `tpuprof ...` command line in TEXT's code blocks (comments dropped) and code spans, one per pipeline
    stage."""
    found = []
    for block in FENCE.findall(text):
        for line in block.splitlines():
            found.append(line.split(" #")[0])
    found += [span for span in CODE_SPAN.findall(FENCE.sub("", text)) if span not in NAMES]
    stages = []
    for line in found:
        stages += [s.strip() for s in re.split(r"\||&&|;", line) if re.match(r"\s*tpuprof(\s|$)", s)]
    return stages


def wrong_names(line: str, options: dict[str, set[str]]) -> list[str]:
    """What LINE names that the CLI does not have."""
    words = line.split()
    command = words[1] if len(words) > 1 and not words[1].startswith("-") else None
    used = set(OPTION.findall(line))
    if command is None:
        return [f"{option} is not an option of tpuprof" for option in sorted(used - ROOT_OPTIONS)]
    if command not in options:
        return [] if command in ANNOUNCED else [f"no command {command!r}: {line}"]
    return [f"{option} is not an option of {command}: {line}" for option in sorted(used - options[command])]


def test_every_command_and_option_shown_exists():
    options = cli_options()
    wrong = []
    for page in PAGES:
        for line in invocations(page.read_text()):
            wrong += [f"{page.relative_to(ROOT)}: {problem}" for problem in wrong_names(line, options)]
    assert not wrong, "\n".join(wrong)


def test_the_readme_shows_every_command():
    text = (ROOT / "README.md").read_text()
    shown = {line.split()[1] for line in invocations(text) if len(line.split()) > 1}
    missing = set(cli_options()) - shown
    assert not missing, f"commands without an example in the README: {sorted(missing)}"


def test_the_readme_is_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


def test_every_link_between_pages_leads_to_one():
    broken = [f"{page.relative_to(ROOT)} -> {target}" for page in PAGES
              for target in LINK.findall(page.read_text()) if not (page.parent / target).is_file()]
    assert not broken, broken


def test_the_check_finds_a_wrong_name():
    """The check can fail: a made-up command, a made-up option and an option of another command are caught."""
    options = cli_options()
    lines = invocations("```\ntpuprof memroy x\ntpuprof memory DIR --frobnicate  # --json is fine here\n```\n"
                        "and `kubectl logs job/x | tpuprof oom --fail-if x` and `tpuprof --versoin`")
    assert lines == ["tpuprof memroy x", "tpuprof memory DIR --frobnicate", "tpuprof oom --fail-if x",
                     "tpuprof --versoin"]
    assert [len(wrong_names(line, options)) for line in lines] == [1, 1, 1, 1]
    assert wrong_names("tpuprof diff a b --fail-if 'x>1' --json", options) == []
