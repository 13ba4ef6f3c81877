"""Triage of TPU out-of-memory messages: read every form XLA:TPU and its runtimes print, recompute
each listed buffer's padding from its shape, and estimate the batch that would fit.

The parser searches the whole message with patterns rather than walking fixed lines: real pastes join
lines ("arguments 0BOutput size 0B"), split them ("Used 21.95G of 15.48G hbm.\\n Exceeded ..."),
prefix them with glog headers, indent them, or cut them short.
"""

from __future__ import annotations

import bisect
import math
import re
from typing import BinaryIO, Iterable

from tpuprof.errors import UserError
from tpuprof.models import shape as shapes
from tpuprof.analyses import framework
from tpuprof.models.oom import (
    COMPILE, EARLY_ABORT, NOT_TPU, RESERVATION, RUNTIME_ALLOCATION,
    BatchEstimate, OomAllocation, OomReport,
)
from tpuprof.sources import oom_log
from tpuprof.units import read_float, read_int, read_size, unit_bytes

UNITS = "BKMGTPE"  # XLA prints sizes in powers of 1024 (HumanReadableNumBytes)
# Units in any case ('1.5g' too, when attached to the number: '5 e' in prose is not 5 EiB).
_SIZE = r"(-?\d+(?:\.\d+)?)\s?((?<=\d)[kmgtpe]|[KMGTPE]?)(?:[iI]?[bB])?"
_EXACT = r"(?:\s*\(\s*([\d,]+)\s*(?:bytes|B)\s*\))?"  # "6.08G (6,532,939,776 bytes)", "32.00MiB (33554432B)"


def size_bytes(number: str, unit: str) -> int:
    """Bytes of a size as XLA prints it ('19.46', 'G'): the one size reader (any case, bounded)."""
    return read_size(number, unit or "")


def size_tolerance(text: str | None) -> float:
    """Half a unit in the last printed digit: '14.00G' is exact to 0.005 GiB."""
    if not text:
        return 0.0
    match = re.fullmatch(_SIZE, text.strip())
    if not match:
        return 0.0
    number, unit = match.groups()
    decimals = len(number.split(".")[1]) if "." in number else 0
    return 0.5 * 10 ** -decimals * unit_bytes(unit or "") + 1


def _size(pattern: str, text: str, flags: int = 0) -> int | None:
    """The first size captured by `pattern`, where the pattern's SIZE groups come first."""
    match = re.search(pattern, text, flags)
    if not match:
        return None
    return _from_groups(match.groups())


def _from_groups(groups) -> int | None:
    number, unit = groups[0], groups[1]
    exact = groups[2] if len(groups) > 2 else None
    if exact:
        return read_int(exact, "the exact size in bytes")
    return size_bytes(number, unit)


# ---------------------------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------------------------

def parse_message(text: str) -> OomReport | None:
    """Read one out-of-memory message. None when the text holds no recognisable TPU OOM."""
    flat = _Flat(text)
    report = _headline(flat)
    if report is None:
        from tpuprof.analyses import oom_serving

        report = oom_serving.headline(flat, _SIZE, size_bytes)  # what servers print: a bare code, a KV budget check
    details = _details(text)
    allocations = _allocations(text)
    if report is None and not details and not allocations:
        return None
    if report is None:
        if _within_capacity(text):
            return None  # a compile's memory report printed by verbose logging: the program fitted
        # Only the breakdown or the allocation list survived the paste: both are compile-time reports.
        heading = re.search(r"^.*(?:Total \w+ usage|Program \w+ requirement).*$", text, re.M)
        headline = (heading.group(0).strip() if heading else _first_line(text)) if details else \
            "(only the allocation list: the message's first lines are not in the input)"
        report = OomReport(kind=COMPILE, headline=headline)
    for key, value in details.items():
        if key in ("arguments_unknown", "program_unknown"):
            setattr(report, key, value)
        elif getattr(report, key) is None:
            setattr(report, key, value)
    report.allocations = allocations or _scoped_allocation(text)
    if report.memory_space is None and allocations:
        listed = _LISTED.search(text)
        report.memory_space = listed.group(1).lower() if listed else "hbm"
    _code_and_runtime_facts(flat.text, report)
    _note_cut_lists(text, report)
    return report


class _Flat:
    """TEXT with each run of whitespace made one space, and the way back to the line it was printed on."""

    def __init__(self, printed: str):
        self.printed = printed
        parts, self._at, self._shift = [], [], []  # flat offset where a run ends -> characters dropped before it
        last, dropped = 0, 0
        for run in re.finditer(r"\s+", printed):
            parts.append(printed[last:run.start()])
            parts.append(" ")
            last = run.end()
            dropped += len(run.group(0)) - 1
            self._at.append(run.end() - dropped)
            self._shift.append(dropped)
        parts.append(printed[last:])
        self.text = "".join(parts)

    def line(self, position: int) -> str:
        """The printed line holding flat POSITION, joined with the lines its sentence wraps onto."""
        index = bisect.bisect_right(self._at, position) - 1
        at = position + (self._shift[index] if index >= 0 else 0)
        start = self.printed.rfind("\n", 0, at) + 1
        end = self.printed.find("\n", at)
        for _ in range(3):  # a wrapped sentence: the line ends inside it and the next goes on
            if end < 0 or not re.search(r"[\w,]\s*$", self.printed[start:end]):
                break
            following = self.printed.find("\n", end + 1)
            if not self.printed[end + 1:following if following >= 0 else None].strip():
                break
            end = following
        line = " ".join(self.printed[start:end if end >= 0 else len(self.printed)].split())
        error = _ERROR_START.search(line)
        if error and len(line[:error.start()].split()) >= 4:  # quoted in prose: "... leads to errors like X: ..."
            line = line[error.start():]
        return line


# Where an error message starts inside a line of prose: its exception type or status.
_ERROR_START = re.compile(r"\b[A-Z]\w*(?:Error|Exception)\b:|\bRESOURCE_EXHAUSTED\b|\bResource exhausted\b")


# "XLA::TPU program HBM usage: 52.5K / 31.25G": libtpu's verbose log of a compile, beside the same breakdown an
# out-of-memory error prints.
_USAGE = re.compile(rf"XLA::TPU program \w+ usage:\s*{_SIZE}\s*/\s*{_SIZE}")


def _within_capacity(text: str) -> bool:
    """A headless breakdown whose program usage lines are all within their capacity: not an error."""
    usages = [(size_bytes(*m.groups()[:2]), size_bytes(*m.groups()[2:4])) for m in _USAGE.finditer(text)]
    return bool(usages) and all(used <= capacity for used, capacity in usages)


# "RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: XLA:TPU compile permanent error. ..." (XLA's error codes,
# openxla/xla docs/errors): the code names the documented failure, so it is kept as printed.
_ERROR_CODE = re.compile(r"\b(E\d{4}):\s*([A-Z][A-Za-z0-9]+):")


def _code_and_runtime_facts(text: str, report: OomReport) -> None:
    """Facts any form may carry: the error code, the runtime allocator's fragmentation figure, and what a
    program load says beside the reservation that failed."""
    s = _SIZE
    code = _ERROR_CODE.search(text)
    if code:
        report.error_code, report.error_name = code.group(1), code.group(2)
    # TPU runtime allocator: "... There are X free. The largest contiguous region of free memory is Y due to
    # fragmentation." (and "Due to fragmentation, the largest contiguous region of free memory is Y").
    report.largest_free_bytes = _size(rf"largest contiguous region of free memory is\s+{s}{_EXACT}", text, re.I)
    loading = re.search(r"Error loading program '([^']+)'", text)
    if loading:
        report.program_name = loading.group(1)
    free = re.search(rf"There are\s+{s}\s+free,\s*{s}\s+reserved,\s*and\s+{s}\s+reservable", text)
    if free:
        if report.reserved_bytes is None:
            report.reserved_bytes = size_bytes(*free.groups()[2:4])
        report.reservable_bytes = size_bytes(*free.groups()[4:6])


# "Allocation (size=N) would exceed memory (size=M) :: #allocation25 [shape = 'u8[N]{0}', space=vmem,
# size = 0x8000000, tag = 'scoped memory for KERNEL'] :: KERNEL" (openxla/xla docs/errors/error_1001.md)
_SCOPED_ALLOCATION = re.compile(
    r"#allocation(\d+)\s*\[shape\s*=\s*'([^']+)',\s*space\s*=\s*(\w+),\s*size\s*=\s*(0x[0-9a-fA-F]+|\d+)"
    r"(?:,\s*tag\s*=\s*'([^']*)')?\]")


def _scoped_allocation(text: str) -> list[OomAllocation]:
    match = _SCOPED_ALLOCATION.search(text)
    if not match:
        return []
    size = match.group(4)
    size_bytes = int(size, 16) if size.lower().startswith("0x") else read_int(size, "the size")
    if size_bytes >= 1 << 63:  # "size = 0xffffffffffffffff": -1 printed unsigned, the size is not known yet
        size_bytes = None
    return [OomAllocation(index=read_int(match.group(1), "the allocation number"), shape=match.group(2),
                          size_bytes=size_bytes, xla_label=match.group(5) or None)]


_LISTED = re.compile(r"Largest program allocations in (\w+):?")


def _note_cut_lists(text: str, report: OomReport) -> None:
    """Say when the allocation list is cut: the largest buffers come first, so a list that starts after 1 or
    a heading with nothing below it misses the ones that matter most."""
    listed = _LISTED.search(text)
    numbered = [a.index for a in report.allocations if a.index is not None]
    if listed and not report.allocations:
        report.notes.append("the log is cut off after 'Largest program allocations': none of the listed "
                            "allocations is in the input")
    elif numbered and numbered[0] > 1 and not _SCOPED_ALLOCATION.search(text):
        report.notes.append(f"the allocation list starts at item {numbered[0]}: items 1-{numbered[0] - 1}, the "
                            "largest, are not in the input")


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def _headline(flat: _Flat) -> OomReport | None:
    """The message's headline form, read with every run of whitespace as one space: pastes and terminals wrap
    its sentences anywhere ("Ran out of memory in" / "memory space vmem", "TensorCore" / "Hbm usage")."""
    s = _SIZE
    text = flat.text
    match = re.search(r"Ran out of memory in memory space (\w+)", text)
    if match:
        space = match.group(1).lower()
        report = OomReport(COMPILE, flat.line(match.start()), memory_space=space)
        used = re.search(rf"Used\s+{s}\s+of\s+{s}\s+{space}", text, re.I)
        if used:
            report.used_bytes = size_bytes(*used.groups()[:2])
            report.capacity_bytes = size_bytes(*used.groups()[2:4])
        report.exceeded_bytes = _size(rf"Exceeded\s+{space}\s+capacity\s+by\s+{s}", text, re.I)
        kernel = re.search(r"while allocating on stack for %?([\w.\-]+)", text)
        report.kernel = kernel.group(1) if kernel else None
        scoped = re.search(
            rf"Scoped allocation with size\s+{s}\s+and limit\s+{s}\s+exceeded scoped (\w+) limit by\s+{s}", text)
        if scoped and report.used_bytes is None:
            # One kernel's scratch against the scoped limit (a compiler flag or the kernel's vmem_limit_bytes),
            # not against the memory's size.
            g = scoped.groups()
            report.used_bytes, report.capacity_bytes = size_bytes(g[0], g[1]), size_bytes(g[2], g[3])
            report.exceeded_bytes = size_bytes(g[5], g[6])
            report.scoped_limit = True
        return report
    match = re.search(rf"Ran out of memory on (\w+),(.{{0,200}}?)\({s}\)\s*exceeds available \w+\s*\({s}\)", text)
    if match:
        space, what = match.group(1).lower(), match.group(2)
        report = OomReport(COMPILE, flat.line(match.start()), memory_space=space)
        required = size_bytes(*match.groups()[2:4])
        if "temporar" in what:
            report.hlo_temp_bytes = required
        else:
            report.used_bytes = required
        report.capacity_bytes = size_bytes(*match.groups()[4:6])
        return report
    match = re.search(rf"Aborting compilation early[^.]*\.\s*Requires\s+{s},\s*has\s+{s}\s+available", text)
    if match:
        report = OomReport(EARLY_ABORT, flat.line(match.start()), memory_space="hbm")
        # The compiler's estimate of what the program would need, not memory it used.
        report.required_bytes = size_bytes(*match.groups()[:2])
        report.capacity_bytes = size_bytes(*match.groups()[2:4])
        return report
    match = re.search(
        rf"TensorCore Hbm usage:?\s*{s},\s*SparseCore Hbm usage:?\s*{s},\s*exceeding available bytes:?\s*{s}",
        text, re.I)
    if match:
        report = OomReport(COMPILE, flat.line(match.start()), memory_space="hbm")
        report.tensorcore_bytes = size_bytes(*match.groups()[:2])
        report.sparsecore_bytes = size_bytes(*match.groups()[2:4])
        report.used_bytes = report.tensorcore_bytes + report.sparsecore_bytes
        report.capacity_bytes = size_bytes(*match.groups()[4:6])
        return report
    match = re.search(rf"Attempting to reserve\s+{s}{_EXACT}\s+at the bottom of memory", text)
    if match:
        report = OomReport(RESERVATION, flat.line(match.start()), memory_space="hbm")
        report.requested_bytes = _from_groups(match.groups())
        report.free_bytes = _size(rf"There are\s+{s}\s+free", text[match.end():])
        report.capacity_bytes = _size(rf"HBM capacity\s+{s}", text)
        report.reserved_bytes = _size(rf"Top-of-Memory reserved:\s*{s}{_EXACT}", text)
        report.currently_allocated_bytes = _size(rf"Currently allocated:\s*{s}{_EXACT}", text)
        return report
    match = re.search(rf"Attempting to allocate\s+{s}{_EXACT}", text)
    if match:
        report = OomReport(RUNTIME_ALLOCATION, flat.line(match.start()), memory_space=_space_tag(text))
        report.requested_bytes = _from_groups(match.groups())
        report.free_bytes = _size(rf"There are\s+{s}\s+free", text[match.end():])
        return report
    match = re.search(rf"Failed to allocate request for\s+{s}{_EXACT}", text)
    if match:
        report = OomReport(RUNTIME_ALLOCATION, flat.line(match.start()), memory_space="hbm")
        report.requested_bytes = _from_groups(match.groups())
        return report
    match = re.search(r"OOM when allocating tensor|CUDA out of memory|Out of memory while trying to allocate", text)
    if match:  # GPU allocators' words: recognised so that the answer can say what they are
        return OomReport(NOT_TPU, flat.line(match.start()))
    match = re.search(r"Allocation \(size=(\d+)\) would exceed memory \(size=(\d+)\)", text)
    if match:
        space = re.search(r"space=(\w+)", text[match.end():])
        report = OomReport(COMPILE, flat.line(match.start()),
                           memory_space=space.group(1).lower() if space else None)
        report.requested_bytes = read_int(match.group(1), "the allocation size")
        report.capacity_bytes = read_int(match.group(2), "the memory size")
        kernel = re.search(r"\]\s*::\s*%?([\w.\-]+)", text[match.end():])
        report.kernel = kernel.group(1) if kernel else None
        return report
    return None


def _space_tag(text: str) -> str:
    match = re.search(r"_(HBM|VMEM|SMEM)\d*\)", text)
    return match.group(1).lower() if match else "hbm"


def _details(text: str) -> dict:
    """The 'Total hbm usage' and 'Program hbm requirement' breakdowns."""
    s = _SIZE
    out: dict = {}
    total = re.search(rf"Total (\w+) usage\s*>=\s*{s}", text)
    program_req = re.search(rf"Program (\w+) requirement\s+{s}", text)
    if total:
        out["memory_space"] = total.group(1).lower()
        out["total_bytes"] = size_bytes(*total.groups()[1:3])
        section = text[total.end():program_req.start() if program_req and program_req.start() > total.end() else None]
        reserved = re.search(rf"reserved\S*\s+{s}", section)
        if reserved:
            out["reserved_bytes"] = size_bytes(*reserved.groups())
        program = re.search(rf"\bprogram\s+{s}", section)
        if program:
            out["program_bytes"] = size_bytes(*program.groups())
        if re.search(r"\barguments\s+unknown size", section):
            out["arguments_unknown"] = True
        if re.search(r"\bprogram\s+unknown size", section):
            out["program_unknown"] = True
    arguments = re.search(rf"\barguments\s+{s}", text)
    if arguments:
        out["arguments_bytes"] = size_bytes(*arguments.groups())
    output = re.search(rf"Output size\s+{s}", text) or re.search(rf"\n\s*output\s+{s}", text)
    if output:
        out["output_bytes"] = size_bytes(*output.groups())
        shares = re.match(rf"[^\n]*?shares\s+{s}\s+with arguments", text[output.end():])
        if shares:
            out["output_shared_bytes"] = size_bytes(*shares.groups())
    if program_req:
        out.setdefault("memory_space", program_req.group(1).lower())
        out.setdefault("program_bytes", size_bytes(*program_req.groups()[1:3]))
        section = text[program_req.end():]
        for key in ("global", "scoped"):
            match = re.search(rf"\b{key}\s+{s}", section)
            if match:
                out[f"{key}_bytes"] = size_bytes(*match.groups())
        temp = re.search(
            rf"HLO temp\s+{s}\s*\(\s*([\d.]+)% utilization"
            rf"(?::\s*Unpadded \({s}\)\s*Padded \({s}\))?,\s*([\d.]+)% fragmentation \({s}\)\)",
            section)
        if temp:
            g = temp.groups()
            out["hlo_temp_bytes"] = size_bytes(g[0], g[1])
            out["utilization"] = read_float(g[2], "the HLO temp utilization")
            if g[3] is not None:
                out["unpadded_bytes"] = size_bytes(g[3], g[4])
                out["padded_bytes"] = size_bytes(g[5], g[6])
            out["fragmentation_bytes"] = size_bytes(g[8], g[9])
        else:
            temp = re.search(rf"HLO temp\s+{s}", section)
            if temp:
                out["hlo_temp_bytes"] = size_bytes(*temp.groups())
    return out


_ENTRY = re.compile(r"(?:^|(?<=\s))(\d+)\.\s+(?=Size:|Operator:|Shape:)", re.M)
# A list that names each allocation by its instruction and shape only ("1. fusion.11963 f32[4,192,1024]"),
# as vmem reports print it: no sizes, but the shape gives them.
_ARRAY_SHAPE = r"(?:pred|bf16|[fsu]\d+|f8\w+|c64|c128)\[[\d,]*\](?:\{[^}\s]*\})?"
_BARE_ENTRY = re.compile(rf"(?:^|(?<=\s))(\d+)\.\s+%?([\w.\-]+)\s+({_ARRAY_SHAPE})", re.M)


# An entry printed without its number, as TensorFlow 1 and 2.2-era runtimes did: "XLA label: ..." or "Size: ..."
# opens it after a blank line or the heading.
_UNNUMBERED_ENTRY = re.compile(r"(?:\A|\n[ \t]*\n)[ \t]*(?=Size:|XLA label:|Operator:|Shape:)")
# The result shape an XLA label gives its instruction: "%fusion.11963 = f32[4,192,1024]{2,0,1:T(4,128)} fusion(".
_LABEL_SHAPE = re.compile(rf"^%?[\w.\-]+\s*=\s*({_ARRAY_SHAPE})\s")


def _allocations(text: str) -> list[OomAllocation]:
    listed = _LISTED.search(text)
    body = text[listed.end():] if listed else text
    starts = list(_ENTRY.finditer(body))
    entries = []
    for i, start in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(body)
        entries.append(_entry(read_int(start.group(1), "the allocation number"), body[start.end():end]))
    if not entries and listed:
        for match in _BARE_ENTRY.finditer(body):
            entries.append(OomAllocation(index=read_int(match.group(1), "the allocation number"),
                                         shape=match.group(3), xla_label=match.group(2)))
    if not entries and listed:
        starts = [m.end() for m in _UNNUMBERED_ENTRY.finditer(body)]
        for i, start in enumerate(starts):
            entry = _entry(None, body[start:starts[i + 1] if i + 1 < len(starts) else len(body)])
            if entry.xla_label is None and entry.size_bytes is None:
                continue
            if entry.shape is None and entry.xla_label:
                shape = _LABEL_SHAPE.match(entry.xla_label)
                entry.shape = shape.group(1) if shape else None
            entries.append(entry)
    return entries


def _entry(index: int | None, text: str) -> OomAllocation:
    s = _SIZE
    entry = OomAllocation(index=index)
    match = re.search(rf"Size:\s*({s})", text)
    if match:
        entry.size_text = match.group(1)
        entry.size_bytes = size_bytes(match.group(2), match.group(3))
    match = re.search(rf"Unpadded size:\s*({s})", text)
    if match:
        entry.unpadded_text = match.group(1)
        entry.unpadded_bytes = size_bytes(match.group(2), match.group(3))
    match = re.search(rf"Extra memory due to padding:\s*{s}\s*\(\s*([\d.]+)x expansion\)", text)
    if match:
        entry.padding_bytes = size_bytes(match.group(1), match.group(2))
        entry.expansion = read_float(match.group(3), "the padding expansion")
    match = re.search(r"Shape:\s*", text)
    if match:
        entry.shape = _shape_token(text, match.end())
    match = re.search(r"Operator:\s*(.*)", text)
    if match:
        operator = match.group(1)
        op_type = re.search(r'op_type="((?:[^"\\]|\\.)*)"', operator)
        op_name = re.search(r'op_name="((?:[^"\\]|\\.)*)(?:"|$)', operator)
        source_file = re.search(r'source_file="([^"]*)"', operator)
        source_line = re.search(r"source_line=(\d+)", operator)
        entry.op_type = op_type.group(1) if op_type else None
        entry.op_name = op_name.group(1).replace("\\n", " ").strip() if op_name else None
        if source_file:
            entry.source = source_file.group(1) + (f":{source_line.group(1)}" if source_line else "")
    match = re.search(r"XLA label:\s*(.*)", text)
    if match:
        entry.xla_label = match.group(1).strip()
    match = re.search(r"Allocation type:\s*([^\n=]*)", text)
    if match:
        entry.allocation_type = match.group(1).strip() or None
    return entry


def _shape_token(text: str, pos: int) -> str | None:
    """The shape after 'Shape:': a token up to whitespace, or a whole parenthesised tuple."""
    if text.startswith("(", pos):
        depth = 0
        for i in range(pos, len(text)):
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            if depth == 0:
                return text[pos:i + 1]
        return text[pos:].split("\n")[0]
    match = re.match(r"\S+", text[pos:])
    return match.group(0) if match else None


# A GPU's out-of-memory text can use the same words as a TPU runtime's ("Failed to allocate request for").
_GPU = re.compile(r"\b(?:GTX|RTX|Tesla|Quadro|GeForce|Titan)\b(?: [A-Z]?\d{2,4}\w{0,3})?|\b[ABHL]100\b|\bH200\b|\bCUDA\b|cuDNN"
                  r"|/(?:device:)?gpu:\d|/device:GPU|\bGPU\b|NVIDIA|ROCm")
_TPU = re.compile(r"\bTPU\b|\btpu_|libtpu|\bhbm\b|\bHBM|TensorCore|XLA:TPU")


def non_tpu_device(text: str) -> str | None:
    """The other device a log names ("GTX 1080", "CUDA") when it names no TPU, else None."""
    if _TPU.search(text):
        return None
    match = _GPU.search(text)
    if not match:
        return None
    name = match.group(0).strip()
    return f"{name} GPU" if re.match(r"GTX|RTX|Tesla|Quadro|GeForce|Titan|[ABHL]\d00|H200", name) else "GPU"


# ---------------------------------------------------------------------------------------------
# Finding the message in a log
# ---------------------------------------------------------------------------------------------

def _detail_score(report: OomReport) -> int:
    fields = sum(v is not None for k, v in vars(report).items() if k.endswith("_bytes"))
    return fields + 2 * len(report.allocations)


# The last frames of a Python traceback before the error: where the framework call that failed is named.
_MARK_STEP_FRAME = re.compile(r"in mark_step\b|_xla_step_marker|xm\.mark_step\(\)\s*$")


def failed_in(context: str) -> str | None:
    """"xm.mark_step" when the traceback just before the message ends inside PyTorch/XLA's mark_step (which runs the
    step's graph), else None."""
    frames = [line for line in context.splitlines()[-8:] if line.strip()]
    return "xm.mark_step" if any(_MARK_STEP_FRAME.search(line) for line in frames) else None


def find_in_stream(stream: BinaryIO, target: str | None = None) -> OomReport | None:
    """The most detailed OOM message of a log (the first one among equals), analysed."""
    best: OomReport | None = None
    found = 0
    seen: dict[int, bool] = {}  # hash of a message -> whether it parsed: workers repeat the same text
    unreadable: UserError | None = None  # the first message whose numbers cannot be real
    other: OomReport | None = None  # the first out-of-memory error of a GPU (not triaged)
    for block in oom_log.iter_oom_blocks(stream):
        key = hash(block.text)
        if key in seen:
            found += seen[key]
            continue
        try:
            report = parse_message(block.text)
        except UserError as error:  # one mangled message among good ones does not hide them
            unreadable = unreadable or UserError(f"the out-of-memory message at line {block.line_number}: {error}")
            report = None
        if len(seen) < 100_000:
            seen[key] = report is not None
        if report is None:
            continue
        surroundings = block.context + "\n" + block.text
        if report.kind == RUNTIME_ALLOCATION and non_tpu_device(surroundings):
            report.kind = NOT_TPU
        if report.kind == NOT_TPU:
            report.device = non_tpu_device(surroundings) or "GPU or CPU"
            other = other or report
            continue
        found += 1
        if best is None or _detail_score(report) > _detail_score(best):
            report.line_number = block.line_number
            job = framework.from_text(surroundings + "\n" + block.evidence)
            report.framework, report.training = job.framework, job.training
            report.failed_in = failed_in(block.context)
            best, best_block = report, block
    if best is None and other is not None:
        return other  # only another device's out-of-memory error: the caller says so
    if best is None:
        if unreadable is not None:
            raise unreadable
        return None
    best.messages_found = found
    from tpuprof.analyses import oom_serving

    oom_serving.attach(best, best_block.context + "\n" + best_block.text + "\n" + best_block.evidence, best_block.head)
    recompute(best, target)
    check_totals(best)
    return best


# ---------------------------------------------------------------------------------------------
# Recomputing padding and checking the log's own arithmetic
# ---------------------------------------------------------------------------------------------

def recompute(report: OomReport, target: str | None = None) -> None:
    for entry in report.allocations:
        if not entry.shape:
            continue
        try:
            shape = shapes.parse_shape(entry.shape)
        except (UserError, ValueError, IndexError):
            entry.disagreements.append(f"the shape {entry.shape} could not be read (cut short?)")
            continue
        if shape.is_tuple:
            continue
        entry.dtype, entry.dims = shape.dtype, shape.dims
        layout = shape.layout
        if layout is not None and not layout.tiles and len(shape.dims) >= 2 \
                and report.memory_space in ("hbm", "vmem", None) and layout.minor_to_major:
            # Older logs print layouts without tiles; XLA:TPU tiles 2-D+ arrays' two minor dims by
            # (8, 128) for 16- and 32-bit types, which is what the sizes in such logs show.
            if shapes.ELEMENT_BITS.get(shape.dtype, 0) >= 16:
                layout = shapes.Layout(layout.minor_to_major, ((8, 128),), layout.element_size_in_bits,
                                       layout.tail_padding_alignment, layout.memory_space)
                shape = shapes.Shape(shape.dtype, shape.dims, layout)
                entry.assumed_tiling = "T(8,128)"
        entry.recomputed_padded_bytes = shape.padded_bytes()
        entry.recomputed_unpadded_bytes = shape.unpadded_bytes()
        entry.padded_dims = shape.padded_dims()
        _compare(entry, "size", entry.size_bytes, entry.size_text, entry.recomputed_padded_bytes)
        _compare(entry, "unpadded size", entry.unpadded_bytes, entry.unpadded_text,
                 entry.recomputed_unpadded_bytes)


def _compare(entry: OomAllocation, what: str, logged: int | None, text: str | None, exact: int) -> None:
    if logged is None:
        return
    if abs(logged - exact) > size_tolerance(text):
        entry.disagreements.append(
            f"the log's {what} {text} disagrees with the tiling math: {format_bytes(exact)} "
            f"({exact:,} bytes) for {entry.shape}"
            + (f" with the assumed {entry.assumed_tiling}" if entry.assumed_tiling else ""))


def check_totals(report: OomReport) -> None:
    """Flag where the log's own numbers do not add up (beyond the rounding of what it prints)."""
    slack = 0.011 * 1024 ** 3  # two values rounded to 0.01G each, plus one printed digit

    def near(a: int, b: int, scale: int) -> bool:
        return abs(a - b) <= max(slack, 0.002 * scale)

    if report.used_bytes is not None and report.capacity_bytes is not None and report.exceeded_bytes is not None:
        if not near(report.used_bytes - report.capacity_bytes, report.exceeded_bytes, report.used_bytes):
            report.notes.append(
                f"used {format_bytes(report.used_bytes)} - capacity {format_bytes(report.capacity_bytes)} "
                f"is not the logged excess {format_bytes(report.exceeded_bytes)}")
    if report.utilization is not None and report.unpadded_bytes is not None and report.padded_bytes:
        # XLA's utilisation is the unpadded size over the padded size of the temporaries (fragmentation is
        # counted apart), printed with one decimal of sizes rounded to 0.01G.
        ratio = 100.0 * report.unpadded_bytes / report.padded_bytes
        rounding = 100.0 * 0.011 * 1024 ** 3 / report.padded_bytes
        if abs(ratio - report.utilization) > 0.15 + rounding:
            report.notes.append(
                f"HLO temp utilisation {report.utilization}% does not match unpadded/padded = {ratio:.1f}%")


# ---------------------------------------------------------------------------------------------
# Batch estimate
# ---------------------------------------------------------------------------------------------

# Op names of buffers whose leading dimension is a vocabulary or a weight's, never the batch.
_NOT_BATCH_OPS = re.compile(r"embed|lm_head|vocab|wte\b|XLA_Args|param|weight|kernel\b|/w\d?\b", re.I)


# A job's own statement of its per-device batch in its log (its config or start-up line): `per_chip_batch=1`
# (the Qwen3 XPK job), MaxText's `per_device_batch_size: 4`, Hugging Face's `per_device_train_batch_size=8`. A
# global batch is not the per-chip one, and a fractional MaxText batch is not a number of examples per chip.
_DECLARED_BATCH = re.compile(
    r"\b(per_chip_batch(?:_size)?|batch_per_chip|per_device_(?:train_|eval_)?batch_size|per_core_batch_size)"
    r"['\"]?\s*[=:]\s*(\d+)(?:\.0)?(?![\d.])")


def declared_batch(text: str) -> tuple[int, str] | None:
    """(the per-chip batch, the text that says so) from a log's own lines, or None."""
    match = _DECLARED_BATCH.search(text)
    if match is None or int(match.group(2)) < 1:
        return None
    return int(match.group(2)), match.group(0)


def shared_dimension(allocations: Iterable[OomAllocation], batch: int | None = None) -> tuple[int | None, float]:
    """The batch dimension of the listed buffers and the share of their bytes that carry it.

    Activations lead with the batch (`f32[32,4096,4096]`, `bf16[8,512,2048]`), so only leading dimensions of
    arrays of rank 3 or more are candidates: a rank-2 array is a weight (`f32[4096,151936]`, the LM head: hidden x
    vocabulary) or a batch flattened with the sequence (`[8192,12288]`), neither a per-chip batch. A size that is
    also another dimension of some listed buffer is a feature size (a vocabulary of 151936 in logits
    `[B, S, 151936]` and in the embedding table, a hidden size), and buffers of embeddings, weights and arguments
    lead with their own sizes: neither is the batch. With --batch (or the log's own statement), that size is the
    batch wherever it appears.
    """
    entries = []
    for entry in allocations:
        size = entry.size_bytes or entry.recomputed_padded_bytes or 0
        if entry.dims and size:
            entries.append((entry, size))
    total = sum(size for _, size in entries)
    if not total:
        return None, 0.0
    if batch:
        carrying = sum(size for entry, size in entries if batch in entry.dims)
        if carrying:
            return batch, carrying / total
    # Sizes seen anywhere but in the leading position: features, heads, sequence, vocabulary.
    feature_sizes = {d for entry, _ in entries for d in entry.dims[1:]}
    weights: dict[int, int] = {}
    for entry, size in entries:
        if len(entry.dims) < 3 or _NOT_BATCH_OPS.search(entry.op_name or "") \
                or (entry.allocation_type or "").lower().startswith(("parameter", "argument")):
            continue
        lead = entry.dims[0]
        if lead > 1 and lead not in feature_sizes:
            weights[lead] = weights.get(lead, 0) + size
    if not weights:
        return None, 0.0
    dim = max(weights, key=lambda d: (weights[d], -d))
    return dim, weights[dim] / total


def fitting_batch(batch: int, scale: float) -> int:
    """The largest batch that fits when BATCH scales to SCALE: a multiple of 8 (the sublane tile, so the
    batch dimension pads nothing) from 8 up, the number itself below 8, and 0 when not even 1 fits."""
    fitting = math.floor(batch * min(scale, 1.0) + 1e-9)
    return fitting - fitting % 8 if fitting >= 8 else max(fitting, 0)


def estimate_batch(report: OomReport, batch: int | None = None, capacity: int | None = None,
                   dump_arguments: int | None = None, dump_batch_arguments: int = 0) -> BatchEstimate:
    """`dump_arguments`: argument bytes from the same program's dump, for messages that omit them;
    `dump_batch_arguments`: the part of them that carries the batch dimension (the inputs)."""
    capacity = report.capacity_bytes or capacity
    if report.kind == EARLY_ABORT and report.required_bytes and capacity:
        return BatchEstimate(None, "none", f"the compiler estimated {report.required_bytes / capacity:,.0f}x the "
                             "memory: a shape is far larger than intended, which a smaller batch will not fix",
                             current_batch=batch)
    want, free = report.requested_bytes, report.free_bytes
    if report.kind == RESERVATION and want and free is not None and 0 < free < want:
        # What failed to load is the program itself: its code and temporaries, and the temporaries scale with the
        # batch. The code does not, so the share that fits is an upper bound.
        estimate = BatchEstimate(free / want, "low", f"the program reserves {format_bytes(want)} (its code and "
                                 f"temporaries) and {format_bytes(free)} is free beside the arrays alive now: its "
                                 "temporaries scale with the batch, its code does not, so this is an upper bound",
                                 scaling_bytes=want, current_batch=batch)
        if batch:
            estimate.fitting_batch = fitting_batch(batch, estimate.scale)
        return estimate
    if report.kind in (RUNTIME_ALLOCATION, RESERVATION, NOT_TPU):
        return BatchEstimate(None, "none", "a run-time allocation failed: the memory is held by other live "
                             "buffers, so the program's batch is not what to shrink first")
    if report.memory_space in ("vmem", "smem"):
        return BatchEstimate(None, "none", f"{report.memory_space} is per-kernel scratch memory: it does not "
                             "grow with the batch")
    dim, share = shared_dimension(report.allocations, batch)
    used = report.used_bytes
    if used is None and report.program_bytes is not None:
        used = report.program_bytes + (report.arguments_bytes or 0)
    if used is None and report.hlo_temp_bytes is not None and report.kind == COMPILE:
        used = report.hlo_temp_bytes  # "HLO temporaries (X) exceed available HBM": arguments are not in X
    if used is None or not capacity:
        if capacity:
            return BatchEstimate(None, "none", "the message gives the capacity but no total usage")
        if used is not None:  # "Total hbm usage >= X" and its breakdown without the headline's "of Y hbm"
            return BatchEstimate(None, "none", f"the message gives the usage ({format_bytes(used)}) but not the "
                                 "capacity (pass --target)")
        return BatchEstimate(None, "none", "the message gives no total and no capacity (pass --target)")
    if used <= 0 or capacity < 0:  # "Used 0B of 16G": nothing to scale by (and no division by zero)
        return BatchEstimate(None, "none", f"the message's figures (used {format_bytes(used)} of "
                             f"{format_bytes(capacity)}) leave nothing to scale with the batch")
    temp = report.hlo_temp_bytes
    from_dump = False
    if report.used_bytes is None and report.program_bytes is None and temp is not None \
            and dump_arguments is not None:
        # The short libtpu form counts temporaries only; inputs with the batch dim scale like them.
        used, from_dump = temp + dump_arguments + dump_batch_arguments, True
        temp += dump_batch_arguments
    if report.kind == EARLY_ABORT or used > 50 * capacity:
        return BatchEstimate(None, "none", "the program needs "
                             f"{used / capacity:,.0f}x the memory: a shape is far larger than intended, "
                             "which a smaller batch will not fix", current_batch=batch)
    if temp is not None and temp <= used and report.arguments_unknown is False \
            and (report.used_bytes is not None or report.program_bytes is not None or from_dump):
        fixed = used - temp
        scale = (capacity - fixed) / temp if temp else None
        shaped = sum(1 for a in report.allocations if a.dims)
        confidence = "high" if dim is not None and share >= 0.6 and shaped >= 2 else "medium"
        arguments_known = report.used_bytes is not None or report.arguments_bytes is not None or from_dump
        if not arguments_known:
            confidence = "low"
        what = "temporaries" + (" and batch inputs" if from_dump and dump_batch_arguments else "")
        reason = (f"{what} ({format_bytes(temp)}) scale with the batch; the rest "
                  f"({format_bytes(fixed)}: arguments{' from the dump' if from_dump else ', globals'}) does not")
        if not arguments_known:
            reason += "; the message does not give the arguments' size, counted as 0"
        if dim is not None and share >= 0.6:
            reason += f"; a dimension of {dim} is in {share:.0%} of the listed bytes"
        estimate = BatchEstimate(scale, confidence, reason, fixed_bytes=fixed, scaling_bytes=temp)
    else:
        estimate = BatchEstimate(capacity / used, "low",
                                 "only the total is known: assumes all of it scales with the batch, so this "
                                 "is an upper bound (parameters and optimizer state do not shrink)",
                                 scaling_bytes=used)
    estimate.batch_dim = dim if share >= 0.5 else None
    estimate.batch_dim_share = share if estimate.batch_dim else None
    if estimate.scale is not None and estimate.scale <= 0:
        estimate.reason += ": even a batch of 1 does not fit, the fixed part alone exceeds the capacity"
    estimate.current_batch = batch
    if batch and estimate.scale is not None and estimate.scale > 0:
        estimate.fitting_batch = fitting_batch(batch, estimate.scale)
    return estimate


def format_bytes(value: int | None) -> str:
    """Like XLA prints sizes: powers of 1024, two decimals."""
    if value is None:
        return "-"
    sign = "-" if value < 0 else ""
    value = abs(value)
    for unit in UNITS:
        if value < 1024 or unit == UNITS[-1]:
            return f"{sign}{value}B" if unit == "B" else f"{sign}{value:.2f}{unit}"
        value /= 1024
    return f"{sign}{value}"
