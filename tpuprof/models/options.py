"""What every command's options object shares: an error that names the option as its caller spelled it (the
Python keyword for the API, the flag on the command line), and the two options several commands take, `--tpu`
(typed slices, parsed once at the edge) and `--price` (overrides of the price table).
"""

from __future__ import annotations

from typing import Any, Mapping

from tpuprof.errors import UserError


class OptionError(UserError):
    """A bad option value. The sentence names the option by its Python keyword (`max_model_len`); the command line
    re-raises it with the flag (`--max-model-len`) through `for_flags`. Each command's subclass sets FLAGS (keyword
    -> flag), KEYWORD (how a keyword is written: `max_model_len`, or `batch_per_chip=` where the API has positional
    arguments too) and VALUES (keyword -> the value's placeholder: `{batch_n}` is `--batch N` or `batch=N`)."""

    FLAGS: Mapping[str, str] = {}
    KEYWORD = "{}"
    VALUES: Mapping[str, str] = {}

    def __init__(self, option: str, template: str):
        self.option, self.template = option, template
        super().__init__(self._sentence(flags=False))

    def for_flags(self) -> UserError:
        """The same sentence naming flags: `{option}` is this option, `{output_len}` (any field) names another."""
        return UserError(self._sentence(flags=True))

    def _sentence(self, flags: bool) -> str:
        names = {name: flag if flags else self.KEYWORD.format(name) for name, flag in self.FLAGS.items()}
        names.update({f"{name}_n": f"{self.FLAGS[name]} {value}" if flags else f"{name}={value}"
                      for name, value in self.VALUES.items()})
        return self.template.format(option=names.get(self.option, self.option), **names)


def tpu_slices(tpu: str | list | tuple, error: type[OptionError], empty: str) -> tuple:
    """`v6e-8,v5p-8` (or a list of names) -> the tpuprof.slices.Slice of each, in the order given, once each.
    EMPTY: the sentence (a template naming `{option}`) when no name is given."""
    from tpuprof import slices

    names = [str(t).strip() for t in (tpu.split(",") if isinstance(tpu, str) else tpu or ()) if str(t).strip()]
    if not names:
        raise error("tpu", empty)
    try:
        return tuple(dict.fromkeys(slices.parse(name) for name in names))
    except UserError as problem:
        raise error("tpu", "{option}: " + template(str(problem))) from None


def price_overrides(prices: Any, error: type[OptionError], option: str = "prices") -> dict:
    """`v6e=2.70,v5e=1.2` or {"v6e": 2.70} -> generation -> tpuprof.prices.Price."""
    from tpuprof import prices as price_table

    if isinstance(prices, Mapping):
        prices = ",".join(f"{name}={value}" for name, value in prices.items())
    try:
        return price_table.parse_overrides(prices)
    except UserError as problem:
        raise error(option, template(str(problem), "--price")) from None


def template(sentence: str, flag: str | None = None) -> str:
    """A sentence (which may quote the user's text) as an OptionError template; FLAG in it becomes `{option}`."""
    escaped = sentence.replace("{", "{{").replace("}", "}}")
    return escaped.replace(flag, "{option}") if flag else escaped
