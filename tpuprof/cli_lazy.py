"""The command line's declarations, kept without importing typer, and a quick parse of plain command lines.

Importing typer (with its vendored click) and building the click commands costs about 35 ms of CPU per run, a
seventh of `tpuprof analyze --json` on a 1 MB capture and more than the whole of `tpuprof oom` on a short log.
cli.py declares each command once, with `Option` and `Argument` taking typer's own arguments; they are recorded
here. A command line made only of a command name and that command's options and arguments, every value valid, is
parsed from those records (`Commands.quick_parse`). Anything else (no command, --help, --version, completion, an
unknown name, a missing or bad value, anything unusual) goes to the real typer app, built from the same records
(`Commands.typer_app`), which prints click's usage errors, "Did you mean", help and completion as before (a bad
value: one sentence, `Commands.run`). The quick
parse gives up rather than guess: a command line is never read differently by the two
(tests/test_cli_quick.py compares them on the same command lines).
"""

import functools
import os
import sys
import typing
from enum import Enum
from pathlib import Path

# Settings the quick parse understands; a declaration with any other (file checks, env vars, counts...) always
# goes to typer.
_QUICK_SETTINGS = {"help", "metavar", "callback", "autocompletion", "min"}


class Declared:
    """`typer.Option(default, *names, **settings)` or `typer.Argument(default, **settings)`, not made yet."""

    def __init__(self, kind: str, default, names: tuple, settings: dict):
        self.kind, self.default, self.names, self.settings = kind, default, names, settings

    def make(self):
        import typer

        if self.kind == "option":
            return typer.Option(self.default, *self.names, **self.settings)
        return typer.Argument(self.default, *self.names, **self.settings)


def Option(default, *names: str, **settings) -> typing.Any:  # noqa: N802 - typer's name, typer's arguments
    return Declared("option", default, names, settings)


def Argument(default, **settings) -> typing.Any:  # noqa: N802
    return Declared("argument", default, (), settings)


def _closed_pipe_is_success(command):
    """`tpuprof ... | head` closes the pipe once the reader has what it wanted: that is success (exit 0, as
    before typer's standalone mode, which would exit 1), and nothing more is written to the closed pipe."""

    @functools.wraps(command)
    def run(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except BrokenPipeError:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise SystemExit(0) from None

    return run


def _for_typer(callback):
    """CALLBACK with typer's Option and Argument as its parameters' defaults, which is where typer reads them."""
    import inspect

    @functools.wraps(callback)
    def run(**values):
        return callback(**values)

    hints = typing.get_type_hints(callback)
    signature = inspect.signature(callback)
    run.__signature__ = signature.replace(parameters=[
        p.replace(default=p.default.make() if isinstance(p.default, Declared) else p.default,
                  annotation=hints.get(p.name, p.annotation))
        for p in signature.parameters.values()])
    return run


class UsageError(Exception):
    """A usage error click has printed, for a caller that reports it again (tpuprof's --json error document)."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


class _GiveUp(Exception):
    """The quick parse leaves this command line to typer."""


class _Param:
    """One parameter of a command as the quick parse reads it."""

    def __init__(self, name: str, declared: Declared, annotation):
        if set(declared.settings) - _QUICK_SETTINGS:
            raise _GiveUp
        self.name, self.declared = name, declared
        self.required = declared.default is ...
        self.multiple = False
        kind = annotation
        if typing.get_origin(kind) is typing.Union:  # Optional[X]
            (kind,) = [arg for arg in typing.get_args(kind) if arg is not type(None)]
        if typing.get_origin(kind) is list:
            self.multiple, (kind,) = True, typing.get_args(kind)
        if kind not in (str, int, float, bool, Path) and not (isinstance(kind, type) and issubclass(kind, Enum)):
            raise _GiveUp
        self.kind = kind
        # Flags: "--json" (True), "--compile/--no-compile" (True / False).
        self.flags: dict[str, bool] = {}
        self.names: list[str] = []
        for name in declared.names:
            if kind is bool:
                on, _, off = name.partition("/")
                self.flags[on.strip()] = True
                if off:
                    self.flags[off.strip()] = False
            else:
                self.names.append(name)

    def convert(self, text: str):
        if text == "":
            raise _GiveUp
        try:
            value = self.kind(text)
        except ValueError:
            raise _GiveUp from None
        minimum = self.declared.settings.get("min")
        if minimum is not None and value < minimum:
            raise _GiveUp
        return value


class _Command:
    """One declared command: its name, its function (wrapped for closed pipes) and typer's command settings."""

    def __init__(self, name: str, callback, settings: dict):
        self.name, self.callback, self.settings = name, callback, settings
        self._quick: tuple | None = None

    def quick_table(self):
        """(parameters, option name -> parameter, arguments) for the quick parse; raises _GiveUp when a parameter is
        beyond it."""
        if self._quick is None:
            import inspect

            hints = typing.get_type_hints(self.callback)
            params = [_Param(p.name, p.default, hints[p.name])
                      for p in inspect.signature(self.callback).parameters.values()]
            options = {name: p for p in params if p.declared.kind == "option" for name in (*p.names, *p.flags)}
            arguments = [p for p in params if p.declared.kind == "argument"]
            if any(p.multiple for p in arguments) and len(arguments) > 1:
                raise _GiveUp  # click spreads positionals over a variadic argument and others: not ours to redo
            self._quick = (params, options, arguments)
        return self._quick


class Commands:
    """The commands cli.py declares (`@commands.command(...)`), as typer's app (`typer_app`) or quickly parsed."""

    def __init__(self, name: str, version: str, **settings):
        self.name, self.version, self.settings = name, version, settings
        self.commands: dict[str, _Command] = {}
        self._app = None

    def command(self, **settings):
        def register(callback):
            name = callback.__name__.replace("_", "-")
            # The command list shows each command's first sentence whole, wrapped if need be (click would cut it
            # to fit one line at 80 columns).
            settings.setdefault("short_help", callback.__doc__.split(". ")[0].rstrip(".") + ".")
            self.commands[name] = _Command(name, _closed_pipe_is_success(callback), settings)
            return callback

        return register

    def run(self, args: list[str], usage_errors_raise: bool = False) -> None:
        """Run the command line ARGS: quickly parsed when it is plain, else by typer, whose usage errors, help and
        completion exit through SystemExit with click's codes. A bad value of an option or argument is one sentence
        (the value is what is wrong, and the sentence names the option: the usage line would add nothing); any
        other usage error (an unknown command or option, a missing one) is click's usage line, its message and
        "Did you mean". USAGE_ERRORS_RAISE: a usage error is raised as UsageError (its message for the caller to use
        too) after it is printed."""
        parsed = self.quick_parse(args)
        if parsed is not None:
            callback, values = parsed
            callback(**values)
            return
        from typer._click import exceptions  # typer's own click (vendored), whose exceptions it raises
        from typer.exceptions import Abort

        try:
            code = self.typer_app()(args=args, prog_name=self.name, standalone_mode=False)
        except exceptions.ClickException as error:
            message = error.format_message()
            if isinstance(error, exceptions.BadParameter) and not isinstance(error, exceptions.MissingParameter):
                print(f"{self.name}: {message}", file=sys.stderr)
            else:
                error.show()
            if usage_errors_raise:
                raise UsageError(message, error.exit_code) from None
            raise SystemExit(error.exit_code) from None
        except Abort:
            raise SystemExit(130) from None
        if isinstance(code, int) and code != 0:  # typer.Exit (help is 0) and Ctrl-C (130), as standalone
            raise SystemExit(code)

    def quick_parse(self, args: list[str]):
        """(callback, keyword arguments) of a plain command line, or None for typer to read it."""
        if not args or f"_{self.name.upper()}_COMPLETE" in os.environ or args[0] not in self.commands:
            return None
        command = self.commands[args[0]]
        try:
            params, options, arguments = command.quick_table()
            values, positionals = {}, []
            rest = iter(args[1:])
            for token in rest:
                if token == "-" or not token.startswith("-"):
                    positionals.append(token)
                    continue
                name, equals, attached = token.partition("=") if token.startswith("--") else (token, "", "")
                param = options.get(name)
                if param is None:
                    raise _GiveUp  # --help, -h, --, a typo, -vm (short options together)...
                if name in param.flags:
                    if equals:
                        raise _GiveUp
                    values[param.name] = param.flags[name]
                    continue
                text = attached if equals else next(rest, "")
                if text.startswith("-"):
                    raise _GiveUp  # a value that looks like an option (or none at the end): click decides
                value = param.convert(text)
                if param.multiple:
                    values.setdefault(param.name, []).append(value)
                else:
                    values[param.name] = value  # given twice: click keeps the last
            if arguments and arguments[0].multiple:
                values[arguments[0].name] = [arguments[0].convert(text) for text in positionals] or None
            else:
                if len(positionals) > len(arguments):
                    raise _GiveUp
                for param, text in zip(arguments, positionals):
                    values[param.name] = param.convert(text)
            for param in params:
                if param.name not in values or values[param.name] is None:
                    if param.required:
                        raise _GiveUp
                    values[param.name] = param.declared.default
                callback = param.declared.settings.get("callback")
                if callback is not None:
                    values[param.name] = callback(values[param.name])
        except _GiveUp:
            return None
        except Exception:  # noqa: BLE001 - a callback refused the value: typer says why, as a usage error
            return None
        return command.callback, values

    def typer_app(self):
        """The typer app of the declared commands, with a root that prints the help when no command is given and
        knows --version."""
        if self._app is not None:
            return self._app
        import typer

        app = typer.Typer(name=self.name, **self.settings)

        def show_version(value: bool) -> None:
            if value:
                print(f"{self.name} {self.version}")
                raise typer.Exit()

        def root(ctx: typer.Context,
                 version: bool = typer.Option(False, "--version", help="Print the version and exit.", is_eager=True,
                                              callback=show_version)) -> None:
            if ctx.invoked_subcommand is None:
                # `tpuprof` alone prints the help and exits 0 (click's no_args_is_help would exit 2).
                print(ctx.get_help())
                raise typer.Exit()

        root.__doc__ = self.settings.get("help")
        app.callback()(root)
        for command in self.commands.values():
            app.command(name=command.name, **command.settings)(_for_typer(command.callback))
        self._app = app
        return app
