"""`tpuprof guide`: the guide for agents names only commands, options and JSON fields that exist.

Commands and options come from the CLI itself (typer's click command), fields from the shipped JSON Schemas, so
a renamed option or field fails here until the guide follows."""

from __future__ import annotations

import re

import typer.main

from conftest import run_cli
from tpuprof import schemas
from tpuprof.cli import app
from tpuprof.commands import guide

CODE_SPAN = re.compile(r"`([^`]+)`")
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*(?![\w])")
IDENTIFIER = re.compile(r"[a-z][a-z0-9_]*")
# Words in code spans that are values rather than fields: a suggestion's severity.
VALUES = {"blocking"}


def cli_options() -> dict[str, set[str]]:
    """Command name -> its options (both names of a flag pair such as --compile/--no-compile), read from the click
    command typer builds."""
    group = typer.main.get_command(app)
    return {name: {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)
                   if opt.startswith("--")} | {"--help"}
            for name, command in group.commands.items()}


def schema_words() -> set[str]:
    """Every property name and enumerated value in the shipped schemas."""
    found: set[str] = set()

    def walk(node) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "properties" and isinstance(value, dict):
                    found.update(value)
                if key == "enum" and isinstance(value, list):
                    found.update(v for v in value if isinstance(v, str))
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    for schema in schemas.all_schemas().values():
        walk(schema)
    return found


def test_the_guide_names_only_what_exists():
    text = guide.text()
    options = cli_options()
    every_option = set().union(*options.values())
    fields = schema_words()
    wrong = []
    for span in CODE_SPAN.findall(text):
        if span.startswith("tpuprof "):
            command = span.split()[1]
            if command not in options:
                wrong.append(f"command {command!r} in {span!r}")
                continue
            wrong += [f"{option} is not an option of {command}" for option in OPTION.findall(span)
                      if option not in options[command]]
        elif span.startswith("--") and " " not in span:
            if span.split("=")[0] not in every_option:
                wrong.append(f"option {span}")
        elif IDENTIFIER.fullmatch(span) and span not in fields and span not in VALUES and span not in options:
            wrong.append(f"field {span!r}")
    assert not wrong, wrong


def test_every_command_is_in_the_guide():
    text = guide.text()
    missing = [name for name in cli_options() if f"`tpuprof {name}" not in text]
    assert not missing, missing


def test_the_check_finds_a_wrong_name():
    """The check can fail: a made-up option, command and field are caught by the same rules."""
    options, fields = cli_options(), schema_words()
    assert "--no-such-option" not in options["memory"] and "peak_heap_byte" not in fields
    assert "frobnicate" not in options
    assert "peak_heap_bytes" in fields and "--fail-if" in options["diff"]


def test_tpuprof_guide_prints_it():
    result = run_cli("guide")
    assert result.returncode == 0 and result.stdout == guide.text()
