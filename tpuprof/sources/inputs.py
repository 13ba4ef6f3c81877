"""The one input registry: what a path or URL given to tpuprof is, and which pipeline loads it.

Every command, `report`, `diff` and the Python API ask `identify` instead of guessing on their own:

- XLA dumps (memory): a dump folder (`--xla_dump_to`), an HloProto (`*.hlo.pb`), buffer-assignment text,
  HLO text;
- profiles (steps): a logdir (its newest run under `plugins/profile/`), a run folder, a `<host>.xplane.pb`,
  or a remote URL (gs://...) of any of these;
- an OOM log (any other text, gzipped or not: `tpuprof oom` finds the error in it);
- a tpuprof `--json` document (memory, analyze, oom, preflight; serve for `report` alone), read by `read_document`.

Identification reads names and at most the first 4 KiB of a file; it never parses a whole input. The
`Input` dataclass at the end is what `report` and `diff` hold per input once loaded: a command's document.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tpuprof.errors import UserError

# Families: which pipeline reads an input (and the kind of document it becomes).
MEMORY, STEPS, OOM, PREFLIGHT, SERVE = "memory", "steps", "oom", "preflight", "serve"
DOCUMENT = "document"  # a tpuprof --json document: its family is the document's own
FAMILY_LABELS = {MEMORY: "XLA dump (memory)", STEPS: "profile (steps)", OOM: "OOM log", PREFLIGHT: "preflight JSON",
                 SERVE: "serve JSON"}
# Kept under its old name: the report's section titles and diff's messages use it.
KIND_LABELS = FAMILY_LABELS
FAMILY_NOUNS = {MEMORY: "an XLA dump", STEPS: "a profile", OOM: "a log with a TPU out-of-memory error"}
COMMANDS = {MEMORY: "memory", STEPS: "analyze", OOM: "oom", PREFLIGHT: "preflight", SERVE: "serve"}

HEAD_BYTES = 4096  # what identification reads of a file
PROFILE_SUFFIX = ".xplane.pb"
# Where a folder's capture files may sit: a run, a plugins/profile folder, a logdir, a folder of logdirs.
PROFILE_PATTERNS = ("*.xplane.pb", "*/*.xplane.pb", "plugins/profile/*/*.xplane.pb",
                    "*/plugins/profile/*/*.xplane.pb")


@dataclass(frozen=True)
class Kind:
    """One kind of input: its name, the family (pipeline) that reads it, and words for people."""

    name: str
    family: str
    label: str  # with its article: "an XLA dump folder"


KINDS = {kind.name: kind for kind in (
    Kind("dump_folder", MEMORY, "an XLA dump folder"),
    Kind("hlo_proto", MEMORY, "an HloProto"),
    Kind("buffer_assignment", MEMORY, "a buffer-assignment text file"),
    Kind("hlo_text", MEMORY, "an HLO text file"),
    Kind("profile_logdir", STEPS, "a profile logdir"),
    Kind("profile_run", STEPS, "a profile run folder"),
    Kind("xplane", STEPS, "a profile (xplane.pb)"),
    Kind("remote_profile", STEPS, "a remote profile"),
    Kind("oom_log", OOM, "a log"),
    Kind("document", DOCUMENT, "a tpuprof --json document"),
    # A folder with neither dumps nor captures: the memory reader says what it expected.
    Kind("folder", MEMORY, "a folder"),
)}


@dataclass(frozen=True)
class Source:
    """A path (or URL) and what it is."""

    path: str
    kind: Kind

    @property
    def family(self) -> str:
        return self.kind.family


def identify(path: str | Path) -> Source:
    """What PATH is, from its name and first bytes. A missing local path is a UserError."""
    text = str(path)
    if "://" in text and not text.startswith("file://"):
        return Source(text, KINDS["remote_profile"])  # gs:// and other remote paths are profiles
    local = Path(text.removeprefix("file://"))
    if not local.exists():
        raise UserError(f"{text} does not exist.")
    if local.is_dir():
        return Source(text, KINDS[_folder_kind(local)])
    if not local.is_file():  # reading its head to tell what it is would take those bytes from the reader
        raise UserError(f"{text} is a pipe or a device, not a file: save it to a file first "
                        "(`tpuprof oom` alone reads a log from a pipe or stdin).")
    return Source(text, KINDS[_file_kind(local)])


def _folder_kind(path: Path) -> str:
    if next(path.glob("*" + PROFILE_SUFFIX), None) is not None:
        return "profile_run"
    if any(next(path.glob(p), None) is not None for p in PROFILE_PATTERNS[1:]):
        return "profile_logdir"
    from tpuprof.sources import hlo_dump

    try:
        if any(entry.is_file() and hlo_dump.classify(entry) is not None for entry in path.iterdir()):
            return "dump_folder"
    except OSError as error:
        raise UserError(f"cannot read {path}: {error.strerror or error}.") from None
    return "folder"


# The first bytes of files people give by mistake, for the sentence that says what the file is.
_FILE_MAGIC = ((b"\x89PNG", "a PNG image"), (b"\xff\xd8\xff", "a JPEG image"), (b"GIF8", "a GIF image"),
               (b"%PDF", "a PDF document"), (b"PK\x03\x04", "a zip archive"), (b"\x7fELF", "an executable (ELF)"),
               (b"BZh", "a bzip2 archive"), (b"\xfd7zXZ", "an xz archive"), (b"\x28\xb5\x2f\xfd", "a zstd archive"))


def _file_kind(path: Path) -> str:
    from tpuprof.sources import hlo_dump

    if path.name.endswith(PROFILE_SUFFIX):
        return "xplane"
    if path.suffix == ".json":
        return "document"
    try:
        classified = hlo_dump.classify(path)
        if classified is not None:
            return classified[0]
        with open(path, "rb") as handle:
            head = handle.read(HEAD_BYTES)
    except OSError as error:
        raise UserError(f"cannot read {path}: {error.strerror or error}.") from None
    if head[:2] == b"\x1f\x8b":  # gzip: a saved job log (`tpuprof oom` reads them), or a dump or capture packed
        refuse_compressed(path)
        return "oom_log"
    if head.lstrip().startswith(b"{") and b'"schema": "tpuprof.' in head:  # a --json document saved as *.txt...
        return "document"
    if b"\0" in head or (head[:1] == b"\x0a" and _binary(head)):
        # Binary: an HloProto (or HloModuleProto) without the usual name starts with field 1, length-delimited.
        if head[:1] == b"\x0a":
            return "hlo_proto"
        what = next((name for magic, name in _FILE_MAGIC if head.startswith(magic)), "a binary file")
        raise UserError(f"{path} is {what}, not an input of tpuprof: it reads XLA dumps (folders, HloProto, HLO or "
                        "buffer-assignment text), profiles (logdirs, *.xplane.pb), OOM logs and tpuprof --json "
                        "files.")
    return text_kind(head) or "oom_log"


def text_kind(head: bytes) -> str | None:
    """"buffer_assignment" or "hlo_text" when the first bytes of a text are an XLA module's, else None."""
    text = head[:HEAD_BYTES].decode("utf-8", "replace").lstrip()
    if text.startswith("BufferAssignment") or "\nallocation 0: size" in text:
        return "buffer_assignment"
    if text.startswith("HloModule"):
        return "hlo_text"
    return None


# Bytes no text holds (tab, newline, form feed, carriage return and ESC, which colours logs, are text). A protobuf's
# field tags and lengths are such bytes; a log may start with an empty line, the byte of an HloProto's first tag.
_NOT_TEXT = bytes(set(range(32)) - {9, 10, 12, 13, 27})


def _binary(head: bytes) -> bool:
    return any(byte in _NOT_TEXT for byte in head)


def refuse_compressed(path: Path) -> None:
    """A gzipped XLA dump file or capture (packed to be shared) is a UserError saying how to read it; a gzipped log
    is left to the OOM triage, which reads it as it is."""
    import gzip
    import zlib
    from shlex import quote

    try:
        with gzip.open(path, "rb") as handle:
            head = handle.read(HEAD_BYTES)
    except (OSError, EOFError, zlib.error):
        return  # cut or not gzip after all: the log reader says so
    inner = path.name.removesuffix(".gz")
    text = head.lstrip()
    if inner.endswith(PROFILE_SUFFIX):
        what, command = "a profile", "analyze"
    elif inner.endswith((".hlo.pb", ".hlo_proto.pb")) or text.startswith((b"HloModule", b"BufferAssignment")) \
            or (head[:1] == b"\x0a" and _binary(head)):
        what, command = "an XLA dump file", "memory"
    else:
        return
    unpacked = quote(str(path.with_name(inner) if inner != path.name else path.with_name(inner + ".out")))
    raise UserError(f"{path} is {what}, gzip-compressed: `gunzip -c {quote(str(path))} > {unpacked}` and "
                    f"`tpuprof {command} {unpacked}` read it.")


def expect(path: str | Path, family: str) -> Source | None:
    """For a command that reads one family: a UserError naming the right command when PATH is clearly
    another family's input (a profile given to `memory`, a dump given to `analyze`); else what it is.
    Inputs whose kind is only a guess (a folder with nothing known in it, any text) are left to the
    command's own reader, which says what it expected."""
    source = identify(path)
    other = source.family
    if source.kind.name == "oom_log" and family != OOM:
        if _holds_an_oom_error(source.path):
            raise UserError(f"{path} is a log with an out-of-memory error, not {FAMILY_NOUNS[family]}: "
                            f"`tpuprof oom {path}` explains it.")
        if family == STEPS:
            raise UserError(f"{path} is a text file, not a profile: analyze reads a logdir, a run folder "
                            "(plugins/profile/<run>) or a <host>.xplane.pb.")
    if other == family or source.kind.name in ("folder", "oom_log", "document"):
        return source
    raise UserError(f"{path} is {source.kind.label}, not {FAMILY_NOUNS[family]}: "
                    f"`tpuprof {COMMANDS[other]} {path}` reads it.")


def _holds_an_oom_error(path: str) -> bool:
    """Whether the text file holds an out-of-memory message (oom's own scan: GB/s, stops at the first)."""
    from tpuprof.sources import oom_log

    try:
        stream, opened = oom_log.open_input(path)
    except UserError:
        return False
    try:
        return next(oom_log.iter_oom_blocks(stream), None) is not None
    except OSError:
        return False
    finally:
        if opened:
            stream.close()


# ---------------------------------------------------------------- tpuprof --json documents

# The family of each command's documents, by the command named in their "schema" (tpuprof/schemas).
SCHEMA_FAMILIES = {"memory": MEMORY, "analyze": STEPS, "oom": OOM, "preflight": PREFLIGHT, "serve": SERVE}


def document_kind(document) -> str | None:
    """Which command's --json document this is (memory, steps, oom, preflight, serve): from its "schema" field, or from
    its keys for documents written before it existed. A tpuprof document that is no input of report and diff
    (capture, diff, report) or of a newer version than this tpuprof reads is a UserError that says so."""
    if not isinstance(document, dict):
        return None
    from tpuprof import schemas

    named = schemas.parse(document.get("schema"))
    if named is not None:  # else the keys tell (a "schema" that is not tpuprof's may be another tool's field)
        command, version = named
        if command not in SCHEMA_FAMILIES:
            raise UserError(f"this is a tpuprof {command} --json document ({document['schema']}): report and diff "
                            "read memory, analyze, oom, preflight and serve documents (diff all but serve).")
        if version > schemas.VERSIONS[command]:
            raise UserError(f"this document follows {document['schema']}, newer than this tpuprof reads "
                            f"({schemas.name(command)}): upgrade tpuprof.")
        return SCHEMA_FAMILIES[command]
    if isinstance(document.get("modules"), list):
        return MEMORY
    if isinstance(document.get("targets"), list):
        return PREFLIGHT
    if isinstance(document.get("hosts"), list) and isinstance(document.get("steps"), dict):
        return STEPS
    if "headline" in document and "allocations" in document:
        return OOM
    return None


def read_document(path: str | Path) -> tuple[str, dict]:
    """(family, document) of a saved tpuprof --json file; anything else is a UserError."""
    from tpuprof import documents

    path = Path(path)
    document = documents.load(path)  # NaN, 5,000-digit numbers, deep nesting, bad bytes: one sentence
    try:
        kind = document_kind(document)
    except UserError as error:
        raise UserError(f"{path}: {error}") from None
    if kind is None:
        raise UserError(f"{path} is not a tpuprof --json document (memory, analyze, oom, preflight or serve).")
    documents.check(document, kind, str(path))  # the renderers and the diff trust what passes
    return kind, document


# ---------------------------------------------------------------- a loaded input

@dataclass
class Input:
    """One input of `report` or `diff`, loaded: its command's --json document (plus extras the page draws:
    "timeline", "per_step", "fix"...), whether it was read from a saved document, and the sample.json that
    may sit beside a committed sample dump (how it was made)."""

    path: str
    kind: str  # memory | steps | oom | preflight | serve
    document: dict
    from_json: bool = False
    meta: dict = field(default_factory=dict)
