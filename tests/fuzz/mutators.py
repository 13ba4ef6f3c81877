"""Structure-aware mutations: bytes, text (numbers, units, layouts, unicode, long lines), protobuf messages
(through their classes: absurd sizes and dims, dangling and cyclic ids, empty and duplicated repeated fields)
and JSON documents (every field replaced by every other type, or removed).

Every mutator takes a `random.Random` and returns a new value; none looks at what the code under test does
(a plain mutation fuzzer). Sizes stay bounded (MAX_INPUT_BYTES) so that one input cannot be a memory
blow-up by itself.
"""

from __future__ import annotations

import copy
import json
import math
import random
import re

MAX_INPUT_BYTES = 4 << 20

INTERESTING_NUMBERS = [
    "0", "-0", "1", "-1", "2", "7", "8", "128", "1.5", "0.0", "-2.5", "007", "1,000", "+1", "1e3", "1e309", "-1e309",
    "1e-400", "nan", "NaN", "inf", "-inf", "Infinity", "2147483647", "2147483648", "4294967296",
    "9223372036854775807", "9223372036854775808", "-9223372036854775808", "18446744073709551616",
    "9" * 30, "9" * 400, "9" * 5000, "1" + "0" * 4400, "0." + "0" * 500 + "1", "1.2.3", "12e", ".5", "5.",
]
UNITS = ["", "B", "b", "K", "k", "KB", "KiB", "kib", "M", "m", "MiB", "G", "g", "GB", "gib", "T", "t", "P", "E",
         "e", "X", "Z", "Y", "iB", "bytes", "%"]
LAYOUT_TOKENS = [
    "T(", "T(8,128)", "T()", "T(0)", "T(0,128)", "T(-5)", "T(*,128)", "T(8,128)(2,1)", "T(1024)", "T(99999999999999999999)",
    "L(0)", "L(-1)", "L(x)", "L(", "L(16)", "E(4)", "E(-1)", "E(99999)", "E()", "S(1)", "S(-3)", "S(abc)", "S(",
    "{", "}", ":", "(", ")", "<=", "?", "[", "]", ",", "1,0", "0,1", "0,1,2,3,4,5", "5,0", "-1,0", "0,0", "{1,0:T(8,128)}",
    "{0:T(8,128)}", "{:T(8,128)}", "{9}", "{1,0:T(8,128", "/*index=5*/", "*", "D(1)", "(((((", ")))))",
]
UNICODE = ["\u202e", "\u0301", "\U0001F600", "\x00", "\ufffd", "\u2028", "\x85", "\x0b", "\x0c", "\r", "\t",
           "\u00e9", "\u4e2d\u6587", "\u0660\u0661", "\ufeff", "\u200b", "\\", "\"", "'", "\x1b[31m", "[bold]", "<b>"]
INTERESTING_INTS = [0, 1, -1, 2, 3, 7, 8, 127, 128, 255, 1023, 1024, 2**31 - 1, 2**31, 2**32, 2**53 + 1,
                    2**62, 2**63 - 1, -(2**63), -(2**31), 10**15, 10**18]
INTERESTING_FLOATS = [0.0, -0.0, 1.0, -1.0, 0.5, 1e308, -1e308, 5e-324, math.inf, -math.inf, math.nan]
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_SIZE = re.compile(r"(\d)((?:[KMGTPE]i?)?B)\b")
_LAYOUT = re.compile(r"\{[^{}\n]{0,200}\}")


def _cap(data):
    return data[:MAX_INPUT_BYTES]


# ------------------------------------------------------------------------------------------- bytes

def mutate_bytes(rng: random.Random, data: bytes, others: list[bytes] = ()) -> bytes:
    """Truncation, bit flips, interesting bytes, deleted/duplicated ranges, splices, the UTF-8 mangling."""
    data = bytearray(data)
    choice = rng.randrange(9)
    if not data:
        return bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 64)))
    n = len(data)
    if choice == 0:  # truncation
        return bytes(data[: rng.randrange(n)])
    if choice == 1:  # bit flips
        for _ in range(rng.randrange(1, 9)):
            data[rng.randrange(n)] ^= 1 << rng.randrange(8)
    elif choice == 2:  # interesting bytes
        for _ in range(rng.randrange(1, 5)):
            data[rng.randrange(n)] = rng.choice([0x00, 0xFF, 0x7F, 0x80, 0x01, 0x0A, 0x08, 0x10, 0x12, 0x1A, 0x22])
    elif choice == 3:  # delete a range
        start = rng.randrange(n)
        del data[start:start + rng.randrange(1, max(2, n // 8))]
    elif choice == 4:  # duplicate a range
        start = rng.randrange(n)
        chunk = data[start:start + rng.randrange(1, 256)]
        at = rng.randrange(n)
        data[at:at] = chunk * rng.randrange(1, 8)
    elif choice == 5 and others:  # splice with another sample
        other = rng.choice(others)
        if other:
            return _cap(bytes(data[: rng.randrange(n)]) + other[rng.randrange(len(other)):])
    elif choice == 6:  # the mangling a text-mode copy does: every byte above 0x7f becomes U+FFFD
        return _cap(bytes(data).decode("latin-1").encode("ascii", "replace")
                    .replace(b"?", b"\xef\xbf\xbd") if rng.random() < 0.5 else
                    bytes(data).decode("utf-8", "replace").encode("utf-8"))
    elif choice == 7:  # random bytes inserted
        at = rng.randrange(n)
        data[at:at] = bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 32)))
    else:  # overwrite with a copy of another part (keeps protobuf-looking bytes)
        a, b = rng.randrange(n), rng.randrange(n)
        length = rng.randrange(1, 64)
        data[a:a + length] = data[b:b + length]
    return _cap(bytes(data))


# ------------------------------------------------------------------------------------------- text

def _replace_match(rng: random.Random, text: str, pattern: re.Pattern, make) -> str:
    matches = list(pattern.finditer(text[:200_000]))
    if not matches:
        return text
    match = rng.choice(matches)
    return text[:match.start()] + make(match) + text[match.end():]


def mutate_text(rng: random.Random, text: str, others: list[str] = (), dictionary: list[str] = ()) -> str:
    """One text mutation: numbers, units, layout tokens, unicode, long lines, line edits, splices, words."""
    choice = rng.randrange(12)
    lines = text.split("\n")
    if choice == 0:
        out = _replace_match(rng, text, _NUMBER, lambda m: rng.choice(INTERESTING_NUMBERS))
    elif choice == 1:
        out = _replace_match(rng, text, _SIZE, lambda m: m.group(1) + rng.choice(UNITS))
    elif choice == 2:  # layout tokens, inside a layout or anywhere
        token = rng.choice(LAYOUT_TOKENS)
        if rng.random() < 0.7:
            out = _replace_match(rng, text, _LAYOUT, lambda m: _splice_in(rng, m.group(0), token))
        else:
            out = _splice_in(rng, text, token)
    elif choice == 3:
        out = _splice_in(rng, text, "".join(rng.choice(UNICODE) for _ in range(rng.randrange(1, 6))))
    elif choice == 4 and lines:  # a very long line
        i = rng.randrange(len(lines))
        line = lines[i] or "x"
        target = rng.choice([10_000, 100_000, 1_000_000])
        lines[i] = (line * (target // len(line) + 1))[:target]
        out = "\n".join(lines)
    elif choice == 5 and lines:  # delete, duplicate or swap lines
        i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
        action = rng.randrange(4)
        if action == 0:
            del lines[i:i + rng.randrange(1, 20)]
        elif action == 1:
            lines[i:i] = [lines[j]] * rng.choice([1, 2, 10, 1000])
        elif action == 2:
            lines[i], lines[j] = lines[j], lines[i]
        else:
            chunk = lines[i:i + 50]
            rng.shuffle(chunk)
            lines[i:i + 50] = chunk
        out = "\n".join(lines)
    elif choice == 6 and others:  # lines of another sample spliced in
        other = rng.choice(others).split("\n")
        i = rng.randrange(len(lines) + 1)
        j = rng.randrange(len(other))
        lines[i:i] = other[j:j + rng.randrange(1, 40)]
        out = "\n".join(lines)
    elif choice == 7:  # truncation
        out = text[: rng.randrange(len(text) + 1)]
    elif choice == 8 and dictionary:  # a word replaced by another sample's word
        out = _replace_match(rng, text, re.compile(r"[\w.%\-]+"), lambda m: rng.choice(dictionary))
    elif choice == 9:  # a number negated, or scaled far out
        out = _replace_match(rng, text, _NUMBER, lambda m: rng.choice(["-" + m.group(0), m.group(0) * 7,
                                                                       m.group(0) + "e400", m.group(0) + "0" * 25]))
    elif choice == 10:  # an empty or whitespace-only input, or only a part of a line
        out = rng.choice(["", " ", "\n", "\n\n\n", "\x00", rng.choice(lines)[: rng.randrange(80)] if lines else ""])
    else:  # bytes-level, decoded back
        out = mutate_bytes(rng, text.encode("utf-8", "surrogatepass")).decode("utf-8", "replace")
    return out[:MAX_INPUT_BYTES]


def _splice_in(rng: random.Random, text: str, token: str) -> str:
    at = rng.randrange(len(text) + 1)
    cut = rng.choice([0, 0, 1, rng.randrange(1, 6)])
    return text[:at] + token + text[at + cut:]


def words(texts: list[str], limit: int = 5000) -> list[str]:
    """Tokens of the samples, for dictionary replacements."""
    found: dict[str, None] = {}
    for text in texts:
        for word in re.findall(r"[\w.%\-]{2,40}", text[:200_000]):
            found[word] = None
            if len(found) >= limit:
                return list(found)
    return list(found)


# ------------------------------------------------------------------------------------------- protobuf

def _set_fields(message):
    return [(fd, value) for fd, value in message.ListFields()]


def _int_range(fd) -> tuple[int, int]:
    from google.protobuf.descriptor import FieldDescriptor as F

    if fd.type in (F.TYPE_UINT64, F.TYPE_FIXED64):
        return 0, 2**64 - 1
    if fd.type in (F.TYPE_UINT32, F.TYPE_FIXED32):
        return 0, 2**32 - 1
    if fd.type in (F.TYPE_INT32, F.TYPE_SINT32, F.TYPE_SFIXED32, F.TYPE_ENUM):
        return -(2**31), 2**31 - 1
    return -(2**63), 2**63 - 1


def _new_scalar(rng: random.Random, fd, old, siblings: list, id_pool: list[int]):
    from google.protobuf.descriptor import FieldDescriptor as F

    if fd.type == F.TYPE_BOOL:
        return not old if isinstance(old, bool) else rng.random() < 0.5
    if fd.type in (F.TYPE_FLOAT, F.TYPE_DOUBLE):
        return rng.choice(INTERESTING_FLOATS)
    if fd.type == F.TYPE_STRING:
        return rng.choice(["", "x" * rng.choice([1, 1000, 200_000]), "".join(rng.choice(UNICODE) for _ in range(4)),
                           "/device:TPU:0", "/host:CPU", "XLA Ops", "Steps", "XLA Modules", "%" + str(old)[:20],
                           str(old)[: rng.randrange(len(str(old)) + 1)], str(old) * 2])
    if fd.type == F.TYPE_BYTES:
        return mutate_bytes(rng, old or b"\x08\x01")[:100_000]
    low, high = _int_range(fd)
    if fd.type == F.TYPE_ENUM and rng.random() < 0.5:
        return rng.choice([v.number for v in fd.enum_type.values])
    choice = rng.randrange(5)
    if choice == 0 and siblings:  # a sibling's value: `share_with_canonical_id = buffer_id` (a self-cycle)
        value = rng.choice(siblings)
    elif choice == 1 and id_pool:  # another message's id: dangling or crossed references
        value = rng.choice(id_pool)
    elif choice == 2 and isinstance(old, int):
        value = old + rng.choice([-1, 1, -old - 1 if old else 1, old])
    else:
        value = rng.choice(INTERESTING_INTS + [rng.randrange(-1000, 1000)])
    return min(max(value, low), high)


def mutate_message(rng: random.Random, message, id_pool: list[int] = (), depth: int = 0) -> None:
    """One in-place mutation somewhere in MESSAGE: a random walk down set fields, then an edit there."""
    from google.protobuf.descriptor import FieldDescriptor as F

    fields = _set_fields(message)
    if not fields:
        descriptor_fields = message.DESCRIPTOR.fields
        if descriptor_fields:
            fd = rng.choice(descriptor_fields)
            _mutate_field(rng, message, fd, id_pool)
        return
    fd, value = rng.choice(fields)
    is_message = fd.type == F.TYPE_MESSAGE
    if is_message and depth < 12 and rng.random() < 0.75:
        if fd.is_repeated:
            if fd.message_type.GetOptions().map_entry:
                if len(value) and rng.random() < 0.8:
                    key = rng.choice(list(value.keys()))
                    item = value[key]
                    if hasattr(item, "DESCRIPTOR"):
                        return mutate_message(rng, item, id_pool, depth + 1)
                return _mutate_field(rng, message, fd, id_pool)
            if len(value) and rng.random() < 0.85:
                return mutate_message(rng, value[rng.randrange(len(value))], id_pool, depth + 1)
        else:
            return mutate_message(rng, value, id_pool, depth + 1)
    _mutate_field(rng, message, fd, id_pool)


def _mutate_field(rng: random.Random, message, fd, id_pool) -> None:
    from google.protobuf.descriptor import FieldDescriptor as F

    siblings = [v for f, v in _set_fields(message) if f is not fd and isinstance(v, int) and not isinstance(v, bool)]
    repeated = fd.is_repeated
    if fd.type == F.TYPE_MESSAGE:
        field = getattr(message, fd.name)
        if repeated and fd.message_type.GetOptions().map_entry:
            action = rng.randrange(4)
            keys = list(field.keys())
            if action == 0 or not keys:
                message.ClearField(fd.name)
            elif action == 1:
                del field[rng.choice(keys)]
            else:  # an entry under another key (duplicate names, dangling or absurd ids)
                key = rng.choice(keys)
                new_key = rng.choice([k for k in INTERESTING_INTS if _fits(fd.message_type.fields_by_name["key"], k)]
                                     + keys) if not isinstance(key, str) else key + "x"
                value = field[key]
                if hasattr(value, "CopyFrom"):
                    field[new_key].CopyFrom(value)
                else:
                    field[new_key] = value
            return
        if repeated:
            action = rng.randrange(6)
            n = len(field)
            if action == 0 or not n:
                message.ClearField(fd.name)
                if action != 0:
                    field.add()
            elif action == 1:  # duplicate an element (duplicated ids, repeated events)
                item = field[rng.randrange(n)]
                for _ in range(rng.choice([1, 1, 2, 50])):
                    field.add().CopyFrom(item)
            elif action == 2:
                del field[rng.randrange(n)]
            elif action == 3:
                items = [type(x)() for x in field]
                for new, old in zip(items, field):
                    new.CopyFrom(old)
                rng.shuffle(items)
                message.ClearField(fd.name)
                for item in items:
                    field.add().CopyFrom(item)
            elif action == 4:
                field.add()  # an empty element
            else:
                del field[rng.randrange(n):]
            return
        if rng.random() < 0.5:
            message.ClearField(fd.name)
        else:
            getattr(message, fd.name).SetInParent()
        return
    if repeated:
        field = getattr(message, fd.name)
        n = len(field)
        action = rng.randrange(5)
        if action == 0 or not n:
            if n:
                message.ClearField(fd.name)
            else:
                field.append(_new_scalar(rng, fd, None, siblings, id_pool))
        elif action == 1:
            field[rng.randrange(n)] = _new_scalar(rng, fd, field[rng.randrange(n)], siblings, id_pool)
        elif action == 2:
            field.append(field[rng.randrange(n)])
        elif action == 3:
            del field[rng.randrange(n)]
        else:
            field.append(_new_scalar(rng, fd, None, siblings, id_pool))
        return
    old = getattr(message, fd.name)
    try:
        setattr(message, fd.name, _new_scalar(rng, fd, old, siblings, id_pool))
    except (ValueError, TypeError):
        message.ClearField(fd.name)


def _fits(fd, value) -> bool:
    low, high = _int_range(fd)
    return low <= value <= high


def id_values(message, limit: int = 2000) -> list[int]:
    """Values of the integer fields named like ids (id, *_id, *_ids), for dangling and crossed references."""
    from google.protobuf.descriptor import FieldDescriptor as F

    found: dict[int, None] = {}
    stack = [message]
    while stack and len(found) < limit:
        current = stack.pop()
        for fd, value in current.ListFields():
            if fd.type == F.TYPE_MESSAGE:
                if fd.is_repeated:
                    items = list(value.values()) if fd.message_type.GetOptions().map_entry else list(value)
                    stack.extend(x for x in items[:200] if hasattr(x, "ListFields"))
                else:
                    stack.append(value)
            elif (fd.name == "id" or fd.name.endswith(("_id", "_ids"))) and fd.type != F.TYPE_STRING:
                for v in (value if fd.is_repeated else [value]):
                    found[int(v)] = None
    return list(found)


# ------------------------------------------------------------------------------------------- JSON

JSON_VALUES = [None, True, False, 0, -1, 1, 2**64, -(2**63), 1.5, -0.5, 1e308, -1e308, math.nan, math.inf, "", "x",
               "NaN", "12", "9" * 5000, [], {}, [1, 2], [None], ["x"], {"a": 1}, [[]], [{}]]


def _paths(document, prefix=(), out=None, limit=20000):
    out = [] if out is None else out
    if len(out) >= limit:
        return out
    if isinstance(document, dict):
        for key, value in document.items():
            out.append(prefix + (key,))
            _paths(value, prefix + (key,), out, limit)
    elif isinstance(document, list):
        for i, value in enumerate(document[:50]):
            out.append(prefix + (i,))
            _paths(value, prefix + (i,), out, limit)
    return out


def mutate_json(rng: random.Random, document, paths: list | None = None):
    """One edit of a JSON value tree (in place where possible; returns the new root)."""
    paths = paths if paths is not None else _paths(document)
    if not paths or rng.random() < 0.03:
        return copy.deepcopy(rng.choice(JSON_VALUES + [document]))
    path = rng.choice(paths)
    parent = document
    try:
        for key in path[:-1]:
            parent = parent[key]
        key = path[-1]
        current = parent[key]
    except (KeyError, IndexError, TypeError):
        return document
    action = rng.randrange(8)
    if action >= 6:  # a value of the same type (most documents then still pass the reader's checks)
        parent[key] = _same_type(rng, current)
    elif action == 0 and isinstance(parent, dict):
        del parent[key]
    elif action == 1 and isinstance(current, list) and current:
        choice = rng.randrange(3)
        if choice == 0:
            current.clear()
        elif choice == 1:
            item = current[rng.randrange(len(current))]
            current.extend(copy.deepcopy(item) for _ in range(rng.choice([1, 2, 100])))
        else:
            rng.shuffle(current)
    elif action == 2 and isinstance(current, (int, float)) and not isinstance(current, bool):
        parent[key] = rng.choice([-current, current * 10**20, 0, -1, math.nan, math.inf, float(current), str(current)])
    elif action == 3 and isinstance(current, dict) and current:  # a key of another field's name
        parent[key] = {**current, rng.choice(list(current)) + "_x": copy.deepcopy(rng.choice(JSON_VALUES))}
    else:
        parent[key] = copy.deepcopy(rng.choice(JSON_VALUES))
    return document


def _same_type(rng: random.Random, value):
    if isinstance(value, bool) or value is None:
        return rng.choice([True, False, None])
    if isinstance(value, int):
        return rng.choice([0, 1, 2, 7, 2**31, 2**53 + 1, 2**63 - 1, value * 2, value // 3, None])
    if isinstance(value, float):
        return rng.choice([0.0, 1e-300, 5e-324, 0.5, 1e18, 9.2e18, value * 1e6, None])
    if isinstance(value, str):
        return rng.choice(["", "x" * 10_000, "".join(rng.choice(UNICODE) for _ in range(5)), value * 3,
                           "/".join([value] * 20), "a/b//c/", "%s%d{}[bold]", None])
    if isinstance(value, list):
        return rng.choice([[], value * 3, value[:1], list(reversed(value))])
    if isinstance(value, dict):
        return {k: v for k, v in value.items() if rng.random() < 0.6}
    return value


def dump_json(rng: random.Random, document) -> bytes:
    """The document as text, sometimes with what json.dumps never writes (5,000-digit numbers, deep nests)."""
    text = json.dumps(document, allow_nan=True)
    roll = rng.random()
    if roll < 0.05:
        text = _replace_match(rng, text, re.compile(r"(?<![\w\"])\d+(?![\w\"])"), lambda m: "9" * 5000)
    elif roll < 0.07:
        depth = rng.choice([1000, 100_000])
        text = _replace_match(rng, text, re.compile(r"\[\]|\{\}|null"), lambda m: "[" * depth + "]" * depth)
    elif roll < 0.12:
        text = mutate_text(rng, text)
    return text.encode("utf-8", "surrogatepass")[:MAX_INPUT_BYTES]
