"""Find TPU out-of-memory messages in a pasted error, a file, stdin or a whole training log.

The log is streamed in large chunks and searched with one compiled bytes regex, so a 1 GB log costs
one pass at regex speed and bounded memory; only the few lines around a hit are decoded and split.
A message ends after a run of lines that look like none of its parts (a traceback, the next step's
logging), so the glog prefixes, blank lines and wrapped lines inside a message do not cut it short.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import BinaryIO, Iterator

CHUNK_BYTES = 8 << 20
MAX_LINE_BYTES = 1 << 16  # longer lines (binary junk, minified dumps) are truncated
MAX_BLOCK_LINES = 5000
MAX_BLOCK_BYTES = 2 << 20
END_AFTER_UNRELATED_LINES = 6
CONTEXT_BYTES = 4096  # what precedes a message, kept to tell the framework (traceback, exception type)
HEAD_BYTES = 1 << 20  # the start of a log, kept for what a serving engine says about itself when it starts

# Any of these starts (or is inside) an out-of-memory message. Searched with bytes.find, one literal at a
# time: CPython's substring search runs at GB/s, a regex alternation over them ten times slower.
TRIGGERS = (
    # A message whose trigger words were wrapped apart is still found by another trigger in it (its status, a
    # later line) and read back from the lines before (_leading_lines). Short literals scan slower: "Ran out" and
    # "Attempting to" cost 15 % of a 0.5 GiB log's time against 3 % for RESOURCE_EXHAUSTED.
    b"RESOURCE_EXHAUSTED",
    b"Ran out of memory", b"Attempting to allocate", b"Attempting to reserve",
    b" requirement ",  # "Program hbm|host|vmem|smem requirement X:"
    b"Aborting compilation early", b"Hbm usage:", b"Failed to allocate request for", b"would exceed memory (size=",
    b"Total hbm usage >=", b"Largest program allocations in", b"Extra memory due to padding:", b". Size: ",
    # Serving engines: an error code and its name with nothing after them, a "Used X of Y hbm" quoted alone, and
    # vLLM's start-up checks of the KV cache budget (tpuprof.analyses.oom_serving).
    b"ProgramAllocationFailure", b"BufferAllocationFailure", b"CompileTimeHbmOom", b"CompileTimeScopedVmemOom",
    b" hbm", b"To serve at least one request", b"exceeds total_hbm_limit_cap_gb",
    # GPU allocators' words: found so that the answer can say the log is not a TPU's.
    b"OOM when allocating tensor", b"CUDA out of memory", b"Out of memory while trying to allocate",
)


class _TriggerFinder:
    """Earliest trigger at or after an offset of one buffer. Each literal's next occurrence is cached,
    so a log with many messages is still scanned once per literal, not once per message."""

    def __init__(self, buf: bytes):
        self.buf = buf
        self.next = {trigger: None for trigger in TRIGGERS}  # offset, -1 (none left), None (unknown)

    def find(self, start: int) -> int:
        best = -1
        for trigger in TRIGGERS:
            cached = self.next[trigger]
            if cached is None or (cached != -1 and cached < start):
                cached = self.next[trigger] = self.buf.find(trigger, start)
            if cached != -1 and (best == -1 or cached < best):
                best = cached
        return best


# Lines that belong to a message (searched anywhere in the line, so log prefixes do not matter).
_PART = re.compile(
    r"Size:|Operator:|Shape:|Unpadded size:|Extra memory due to padding|XLA label:|Allocation type:"
    r"|={10,}|-{8,}|Total \w+ usage|Program \w+ requirement|Largest program allocations|Output size"
    r"|^\W*(?:reserved|program|arguments|global|scoped|HLO temp|overlays|output|heap allocations)\b"
    r"|HBM capacity|Top-of-Memory|Currently allocated|Program requirement|Available after request"
    r"|Heap allocator status|Max free chunk|Persistent allocations|attempting reservation"
    r"|Ran out|Attempting to|Exceeded \w+ capacity|Hbm usage|Aborting compilation"
    r"|Failed to allocate|would exceed|OOM when allocating|CUDA out of memory|Out of memory while trying"
    r"|largest contiguous region|reservable|That was not possible|There are \S+ free|Scoped allocation with size"
    r"|memory space \w+|XLA::TPU program|Requires \S+, has|RESOURCE_EXHAUSTED|Resource exhausted|ResourceExhausted"
    r"|Compilation failure"
    r"|\bE\d{4}:\s*[A-Z]\w+:|AllocationFailure|CompileTime\w*Oom|Error loading program|Used \S+ of \S+ hbm"
    r"|To serve at least one request|exceeds total_hbm_limit_cap_gb"
)

# A line that opens a message whose trigger is on the next line, besides the lines _PART knows: an error code and
# its name ending it ("E1001: CompileTimeScopedVmemOom:"), or XLA's status sentence ("compile permanent error.").
_LEAD = re.compile(r"\bE\d{4}:\s*[A-Z]\w+:\s*$|compile permanent error\.?\s*$")

# Log-line prefixes: timestamps, glog/absl headers, Python logging, process tags, quoting.
_PREFIXES = [
    re.compile(r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?:?\s+"),
    re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+\s+[\w./-]+:\d+\]\s?"),
    re.compile(r"^[IWEF](?:\s+\d+)?\s+[\w./-]+:\d+\]\s?"),
    re.compile(r"^(?:INFO|WARNING|ERROR|CRITICAL|DEBUG|FATAL):[\w.-]*:\s?"),
    re.compile(r"^\[[^\]\n]{1,40}\](?:<\w+>)?:?\s"),
    re.compile(r"^\((?:pid=\d+|\d+)[^)]{0,40}\)\s"),
    # vLLM's processes and Ray's actors: "(EngineCore_DP0 pid=409600) ", "(RayWorkerWrapper pid=7, ip=10.0.0.2) "
    re.compile(r"^\([A-Za-z][\w-]{0,40}(?: rank=\d+)? pid=\d+(?:, ip=[\d.]+)?\)\s"),
    # vLLM's logger: "ERROR 08-07 23:27:17 [core.py:1349] ", and before 0.8 "INFO 02-20 00:01:02 kv_cache_utils.py:522] "
    re.compile(r"^(?:INFO|WARNING|ERROR|DEBUG|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[?[\w./-]+:\d+\]\s?"),
    re.compile(r"^\d{1,3}(?:\.\d{1,3}){3}\s+\[\d+\]\s+"),  # xla_dist: the worker's address and index
    re.compile(r"^>\s?"),
]
_MARKDOWN = re.compile(r"\*\*|`")


MAX_LEADING_LINES = 64


def _leading_lines(context: str) -> list[str]:
    """The lines just before a trigger that are the same message's: the error code ending the line before it,
    or the head of a breakdown pasted without its headline ("    program 97.92G" / "    arguments 0B" / "Output
    size 0B; ..." above "Program hbm requirement"). They stop at an unrelated line or at two blank lines (the end
    of an earlier message, whose reading stopped after unrelated lines)."""
    if not context.endswith("\n"):
        return []
    taken: list[str] = []
    blanks = 0
    for raw in reversed(context[:-1].split("\n")[-MAX_LEADING_LINES:]):
        line = clean_line(raw)
        if not line.strip():
            blanks += 1
            if blanks == 2:
                break
            taken.append(line)
            continue
        if not (_PART.search(line) or _LEAD.search(line)):
            break
        blanks = 0
        taken.append(line)
    while taken and not taken[-1].strip():
        taken.pop()
    return taken[::-1]


def _continues(previous: str, line: str) -> bool:
    """LINE goes on with the sentence PREVIOUS ends inside (a paste or terminal wrapped it: "Exceeded hbm capacity
    by" / "6.47G.")."""
    if not line.strip() or re.search(r"[.!?]\s*$", previous) or not previous.strip():
        return False
    return previous.rstrip().endswith(",") or bool(re.match(r"\s*[^A-Z\s]", line))


def clean_line(line: str) -> str:
    """Strip log prefixes and markdown residue, keeping the message's own indentation."""
    line = line.rstrip("\r\n")
    for _ in range(3):  # prefixes nest: "2020-05-04 09:05:40.72: E 1578 xla_util.cc:76] "
        before = line
        for prefix in _PREFIXES:
            line = prefix.sub("", line, count=1)
        if line == before:
            break
    line = _MARKDOWN.sub("", line)
    return line.replace("\\.", ".")


@dataclass
class OomBlock:
    text: str  # the message's lines, cleaned
    line_number: int  # 1-based line of the log where it starts
    context: str  # up to CONTEXT_BYTES of log before it, for framework detection
    # The message's lines as logged (their glog/source-file prefixes) and the lines that ended it, up to
    # CONTEXT_BYTES: the framework is often named only there ("xla_client/xla_util.cc:88]", "(EngineCore_DP0").
    evidence: str = ""
    # The log's first HEAD_BYTES: a server prints its settings when it starts, far above a later failure.
    head: str = ""


class _Stream:
    """A binary stream read in chunks; `pos` is always at the start of a line."""

    def __init__(self, stream: BinaryIO):
        self.stream = stream
        self.buf = b""
        self.pos = 0
        self.eof = False
        self.line_number = 1  # of the line at `pos`
        self._counted_to = 0  # newlines before this offset in `buf` are already counted
        self._finder: _TriggerFinder | None = None
        self.head: str | None = None  # the log's first HEAD_BYTES, decoded once

    def _fill(self) -> bool:
        if self.eof:
            return False
        chunk = self.stream.read(CHUNK_BYTES)
        if not chunk:
            self.eof = True
            return False
        if self.head is None:
            self.head = chunk[:HEAD_BYTES].decode("utf-8", "replace")
        keep_from = max(0, self.pos - CONTEXT_BYTES)
        self.buf = self.buf[keep_from:] + chunk
        self.pos -= keep_from
        self._counted_to -= keep_from
        return True

    def _advance(self, new_pos: int) -> None:
        self.line_number += self.buf.count(b"\n", max(self.pos, self._counted_to), new_pos)
        self.pos = new_pos
        self._counted_to = new_pos

    def next_trigger(self) -> bool:
        """Move to the start of the next line holding a trigger; False at the end of the stream."""
        while True:
            if self._finder is None or self._finder.buf is not self.buf:
                self._finder = _TriggerFinder(self.buf)
            found = self._finder.find(self.pos)
            if found >= 0:
                self._advance(self.buf.rfind(b"\n", self.pos, found) + 1 or self.pos)
                return True
            # Keep the last partial line: a trigger may straddle the chunk boundary. A "line" with
            # no newline for megabytes (binary junk) keeps only its tail.
            last_newline = self.buf.rfind(b"\n", self.pos)
            if last_newline >= 0:
                self._advance(last_newline + 1)
            if len(self.buf) - self.pos > MAX_LINE_BYTES:
                self.pos = len(self.buf) - 256
                self._counted_to = max(self._counted_to, self.pos)
            if not self._fill():
                self._advance(len(self.buf))
                return False

    def readline(self) -> bytes | None:
        while True:
            newline = self.buf.find(b"\n", self.pos)
            if newline >= 0:
                line = self.buf[self.pos:newline]
                self._advance(newline + 1)
                return line[:MAX_LINE_BYTES]
            if len(self.buf) - self.pos > MAX_LINE_BYTES or not self._fill():
                if self.pos >= len(self.buf):
                    return None
                line = self.buf[self.pos:self.pos + MAX_LINE_BYTES]
                self._advance(len(self.buf))
                return line

    def context(self) -> str:
        return self.buf[max(0, self.pos - CONTEXT_BYTES):self.pos].decode("utf-8", "replace")


def iter_oom_blocks(stream: BinaryIO) -> Iterator[OomBlock]:
    """Yield every out-of-memory message in the stream, in order, one at a time."""
    reader = _Stream(stream)
    while reader.next_trigger():
        start_line = reader.line_number
        context = reader.context()
        evidence: list[str] = []
        evidence_bytes = 0
        lines = _leading_lines(context)
        last_related = len(lines) - 1
        start_line -= len(lines)
        size = 0
        while len(lines) < MAX_BLOCK_LINES and size < MAX_BLOCK_BYTES:
            raw = reader.readline()
            if raw is None:
                break
            decoded = raw.decode("utf-8", "replace")
            line = clean_line(decoded)
            size += len(raw)
            lines.append(line)
            if evidence_bytes < CONTEXT_BYTES:
                evidence.append(decoded)
                evidence_bytes += len(raw)
            wraps_on = len(lines) > 1 and last_related == len(lines) - 2 and _continues(lines[-2], line)
            if _PART.search(line) or wraps_on:
                last_related = len(lines) - 1
            elif len(lines) - 1 - last_related >= END_AFTER_UNRELATED_LINES:
                break
        del lines[last_related + 1:]  # the unrelated tail that ended the message
        yield OomBlock("\n".join(lines), start_line, context, "\n".join(evidence), reader.head or "")


def open_input(path: str | None):
    """A binary stream for a path, '-' or None (stdin), gunzipped when it is gzip (saved job logs often
    are). Returns (stream, opened): the caller closes what it opened."""
    import gzip

    from tpuprof.errors import UserError

    if path in (None, "-"):
        stream, opened = sys.stdin.buffer, False
    else:
        try:
            stream, opened = open(path, "rb"), True
        except IsADirectoryError:
            raise UserError(f"{path} is a folder: give the log file (use --dump for an XLA dump folder).") from None
        except OSError as error:
            raise UserError(f"cannot read {path}: {error.strerror or error}.") from None
    peek = getattr(stream, "peek", None)
    if peek is not None and peek(2)[:2] == b"\x1f\x8b":
        return _GzipReader(gzip.GzipFile(fileobj=stream), stream), True
    return stream, opened


class _GzipReader:
    """gzip stream whose truncation or corruption is one sentence, not a traceback."""

    def __init__(self, gz, raw):
        self.gz, self.raw = gz, raw

    def read(self, size: int) -> bytes:
        import gzip
        import zlib

        from tpuprof.errors import UserError

        try:
            return self.gz.read(size)
        except (EOFError, OSError, zlib.error, gzip.BadGzipFile) as error:
            raise UserError(f"the gzip log is damaged or cut short ({error}).") from None

    def close(self) -> None:
        self.gz.close()
        if self.raw is not getattr(sys.stdin, "buffer", None):
            self.raw.close()
