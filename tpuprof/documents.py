"""Reading tpuprof's own --json documents back (`report` and `diff` take them as inputs): the one place that
checks them, so that the renderers and the diff can trust every field they read.

The contract is the versioned JSON Schema of the command that wrote the document (tpuprof/schemas, published in
docs/json.md): a saved document may have been edited, cut short or written by another tool, and one that does not
follow its schema (a field of another type, a number out of its range, a missing required field) is a UserError
that names the first such field. Fields the schema does not name are ignored (newer documents may have more), and
documents written before the "schema" field existed are checked as if they carried it. A new field is one edit of
its schema: nothing here names fields.

fastjsonschema checks them: it compiles a schema to Python (kept in the cache for the next run) and checks a 25 MB
memory document in 0.2 s where jsonschema takes 9.7 s (docs/json.md). The schemas' enums are held as their values'
types (a newer tpuprof may write a value this one does not know). The JSON itself may not hold NaN, Infinity,
integers of more than 40 digits or nesting deeper than Python's recursion limit (load), and a number without a
fraction (3.0) is read as the integer JSON Schema counts it as.
"""

from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path

from tpuprof.errors import UserError

_MAX_INT_DIGITS = 40
# The command whose schema a report/diff input kind follows (tpuprof.sources.inputs names analyze's "steps").
COMMANDS = {"memory": "memory", "steps": "analyze", "oom": "oom", "preflight": "preflight", "serve": "serve"}

# sample.json beside a committed sample dump: how it was made (advisory: a bad one is ignored).
SAMPLE = {"type": "object", "properties": {"target": {"type": ["string", "null"]},
                                           "batch_size": {"type": ["integer", "null"], "minimum": 0},
                                           "dtype": {"type": ["string", "null"]}, "note": {"type": ["string", "null"]}}}


def _no_constants(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > _MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(text)} digits")
    return int(text)


def _number(text: str) -> int | float:
    # JSON Schema counts 3.0 as an integer; the readers index and count with integer fields, so it is read as one.
    value = float(text)
    return int(value) if value.is_integer() else value


def load(path: Path):
    """The JSON value in PATH; NaN, Infinity, huge integers, deep nesting and bad bytes are a UserError."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise UserError(f"cannot read {path}: {error.strerror or error}.") from None
    except UnicodeDecodeError:
        raise UserError(f"{path} is not UTF-8 text: not a tpuprof --json document.") from None
    try:
        return json.loads(text, parse_constant=_no_constants, parse_int=_bounded_int, parse_float=_number)
    except json.JSONDecodeError as error:
        raise UserError(f"{path} is not valid JSON ({error.msg} at line {error.lineno}).") from None
    except (ValueError, RecursionError) as error:
        reason = "nested too deeply" if isinstance(error, RecursionError) else str(error)
        raise UserError(f"{path} is not valid JSON ({reason}).") from None


def check(document, kind: str, source: str) -> None:
    """Raise a UserError naming the first field of DOCUMENT that does not follow the schema of KIND's command."""
    from tpuprof import schemas

    command = COMMANDS[kind]
    if isinstance(document, dict):  # the name is checked already (inputs.document_kind); older documents lack it
        document = {**document, "schema": schemas.name(command)}
    problem = _problem(_compiled(command), document, kind)
    if problem:
        raise UserError(f"{source} is not a usable tpuprof {kind} --json document: {problem}.")


def valid(document, schema: dict) -> bool:
    """Whether DOCUMENT follows SCHEMA, a JSON Schema such as SAMPLE."""
    return _problem(_compile(json.dumps(schema)), document, "") is None


@functools.cache
def _compiled(command: str):
    """The compiled check of COMMAND's schema. Python takes 0.1-0.2 s to compile the 0.2-0.6 MB of code
    fastjsonschema writes for one, so the compiled code is kept in the cache for the next run (keyed by the schema,
    fastjsonschema's version and Python's); it loads in milliseconds."""
    import hashlib
    import marshal
    import sys

    import fastjsonschema

    from tpuprof import schemas

    schema = _inline(schemas.schema(command))
    schema.pop("$id", None)  # the root function is then fastjsonschema's `validate`
    text = json.dumps(schema, sort_keys=True)
    key = hashlib.sha256(f"{fastjsonschema.VERSION}\n{sys.implementation.cache_tag}\n{text}".encode()).hexdigest()
    path = _cache_folder() / f"{command}-{key[:16]}.marshal"
    code = None
    try:
        code = marshal.loads(path.read_bytes())
    except (OSError, ValueError, EOFError, TypeError):  # not there yet, or damaged: compiled again below
        pass
    if code is None:
        source = fastjsonschema.compile_to_code(schema, use_default=False, use_formats=False)
        code = compile(source, f"<tpuprof {command} schema>", "exec")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            staging = path.with_name(f".{path.name}.{os.getpid()}")
            staging.write_bytes(marshal.dumps(code))
            os.replace(staging, path)  # processes may compile at once: each sees the file whole or not at all
        except OSError:
            pass  # no cache to be had: the next run compiles again
        _prune(path.parent, command, keep=path.name)
    namespace = {}
    exec(code, namespace)
    return namespace["validate"]


def _prune(folder: Path, command: str, keep: str) -> None:
    """Delete COMMAND's compiled checks other than KEEP: each is keyed by a schema (and fastjsonschema's and Python's
    versions) that a newer one replaced, and nothing else ever deletes them."""
    stale = re.compile(rf"{re.escape(command)}-[0-9a-f]{{16}}\.marshal")
    try:
        for entry in folder.iterdir():
            if entry.name != keep and stale.fullmatch(entry.name):
                entry.unlink(missing_ok=True)
    except OSError:
        pass  # a cache that cannot be tidied still works


def _cache_folder() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tpuprof" / "schemas"


@functools.cache
def _compile(schema_text: str):
    import fastjsonschema

    # use_default=False: the check must not fill in the schema's defaults (it would edit the document).
    return fastjsonschema.compile(json.loads(schema_text), use_default=False, use_formats=False)


def _inline(schema):
    """SCHEMA as the readers hold a document to it: its references to the other schema files replaced by what they
    refer to (preflight's memory module is memory.schema.json's), so that it compiles on its own, and its enums by
    their values' types. The enums say what this tpuprof writes; a newer one may write another value, and the
    readers word a value they do not know, so its type is what they rely on."""
    if isinstance(schema, list):
        return [_inline(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    if isinstance(schema.get("$ref"), str) and not schema["$ref"].startswith("#"):
        return _inline(_resolve(schema["$ref"]))
    out = {key: _inline(value) for key, value in schema.items() if key not in ("enum", "const")}
    if "type" not in out and ("enum" in schema or "const" in schema):
        values = schema["enum"] if "enum" in schema else [schema["const"]]
        out["type"] = sorted({_JSON_TYPE_NAMES.get(type(v), "number") for v in values})
    return out


_JSON_TYPE_NAMES = {str: "string", bool: "boolean", type(None): "null", dict: "object", list: "array"}


def _resolve(ref: str) -> dict:
    from tpuprof import schemas

    file, _, pointer = ref.partition("#")
    node = schemas.schema(file.removesuffix(".schema.json"))
    for part in filter(None, pointer.split("/")):
        node = node[part]
    return node


def _problem(validate, value, where: str) -> str | None:
    """None when VALUE passes VALIDATE (a compiled schema), else one clause naming the first field that does not
    and what it should be: where.a[0].b should be a non-negative integer, not a string."""
    from fastjsonschema import JsonSchemaValueException

    try:
        validate(value)
        return None
    except JsonSchemaValueException as error:
        failed, schema, rule = error.value, error.definition, error.rule
        where = _field(value, error.path[1:], where)  # path: ['data', 'modules', '0', ...]
    if rule == "required":
        missing = next(name for name in schema["required"] if name not in failed)
        return f"{where}.{missing} is missing".lstrip(".")
    if rule in ("anyOf", "oneOf"):
        # A branch of the value's type says what is wrong inside it (preflight's memory: an object, or null).
        for branch in schema[rule]:
            if _admits(branch, failed):
                inner = _problem(_compile(json.dumps(branch)), failed, where)
                if inner:
                    return inner
        return f"{where} should be {_expected(schema[rule])}, not {_kind(failed)}"
    if rule in ("type", "minimum", "exclusiveMinimum"):
        return f"{where} should be {_expected([schema])}, not {_kind(failed)}"
    if rule in ("maximum", "exclusiveMaximum"):
        return f"{where} should be {_expected([schema])} up to {schema[rule]}, not {_kind(failed)}"
    if rule in ("minItems", "maxItems"):
        bound = "at least" if rule == "minItems" else "at most"
        return f"{where} should be a list of {bound} {schema[rule]} items, not {len(failed)}"
    return f"{where} does not follow its schema (its {rule} rule)"


_JSON_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def _field(document, path: list[str], where: str) -> str:
    """The field PATH reaches in DOCUMENT, as where.modules[0].name (an index where the container is a list)."""
    value, start = document, where
    try:
        for step in path:
            if isinstance(value, list):
                where, value = f"{where}[{step}]", value[int(step)]
            else:
                where, value = f"{where}.{step}" if where else step, value[step]
    except (LookupError, ValueError, TypeError):  # a key with '.' or '[' in it: fastjsonschema's path split it
        return ".".join([start, *path] if start else path)
    return where


_JSON_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def _admits(schema: dict, value) -> bool:
    """Whether SCHEMA's type (if it has one) takes VALUE's JSON type."""
    types = schema.get("type")
    if types is None:
        return True
    for name in [types] if isinstance(types, str) else types:
        if name in _JSON_TYPES and isinstance(value, _JSON_TYPES[name]):
            return True
        if name in ("number", "integer") and isinstance(value, (int, float)) and not isinstance(value, bool):
            return True
    return False


_NOUNS = {"string": "a string", "boolean": "true or false", "array": "a list", "object": "an object"}


def _expected(branches: list[dict]) -> str:
    """What the schemas BRANCHES allow, in words: 'a non-negative integer', 'an object' (null, always also
    allowed where it is, goes unsaid as it did)."""
    words = []
    for schema in branches:
        types = schema.get("type", [])
        for name in [types] if isinstance(types, str) else types:
            if name in ("integer", "number"):
                word = _numeral(name, schema)
            elif name == "null":
                continue
            else:
                word = _NOUNS[name]
            if word not in words:
                words.append(word)
    return " or ".join(words) or "something else"


def _numeral(name: str, schema: dict) -> str:
    noun = "integer" if name == "integer" else "number"
    if schema.get("exclusiveMinimum") == 0 or schema.get("minimum") == 1 and noun == "integer":
        return f"a positive {noun}"
    low = schema.get("minimum")
    if low == 0:
        return f"a non-negative {noun}"
    if low is not None and low > 0:
        return f"a {noun} of at least {low}"
    return "an integer" if noun == "integer" else "a number"


def _kind(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return f"the number {value!r:.40}"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
