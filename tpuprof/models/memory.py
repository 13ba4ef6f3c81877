"""What the memory analysis produces: buffers, per-op totals, the peak, and suggestions."""

from __future__ import annotations

from dataclasses import dataclass, field

# How a module's figures were obtained ("method" in --json).
METHOD_BUFFER_ASSIGNMENT = "buffer_assignment"  # the compiler's TPU buffer assignment, read as is: exact
METHOD_RECOMPILED = "recompiled"  # recompiled with libtpu here, then its buffer assignment: exact
# A sharded (SPMD) module recompiled here on one device: exact for the whole program on one chip, not per device.
METHOD_RECOMPILED_ONE_DEVICE = "recompiled_one_device"
METHOD_HLO_LIVENESS = "hlo_liveness"  # liveness over scheduled HLO with TPU layouts: an estimate
METHOD_UNSCHEDULED_BOUND = "unscheduled_bound"  # no TPU schedule or layouts: an estimate within a range
# The methods whose figures are the compiler's own, per device.
PER_DEVICE_COMPILER_METHODS = (METHOD_BUFFER_ASSIGNMENT, METHOD_RECOMPILED)

# Allocation kinds, in XProf's precedence order (an entry parameter that is also live-out is a parameter).
PARAMETER, OUTPUT, THREAD_LOCAL, CONSTANT, TEMP = "parameter", "output", "thread-local", "constant", "temp"


@dataclass(slots=True)
class Buffer:
    """One logical buffer (an HLO value): what the compiler allocates for one instruction output."""

    id: int
    instruction: str  # name, with the shape index for a tuple element: "fusion.3{1}"
    opcode: str
    shape: str  # with layout, as XLA prints it
    size_bytes: int  # padded: what the compiler reserves
    unpadded_bytes: int  # dense: what the data needs
    allocation_type: str
    op_name: str = ""  # framework op from metadata
    source_line: str = ""  # file:line from metadata
    memory_space: int = 0  # 0 is HBM
    live_at_peak: bool = False
    # (dimension index, size, padded size) for each dim the first tile rounds up.
    padded_dims: list[tuple[int, int, int]] = field(default_factory=list)
    minor_to_major: tuple[int, ...] = ()
    tile: tuple[int, ...] = ()
    dtype: str = ""  # element type, known even before the shape text is filled in

    @property
    def padding_bytes(self) -> int:
        padding = self.size_bytes - self.unpadded_bytes  # read for every buffer of a large module: no call to max()
        return padding if padding > 0 else 0

    @property
    def expansion(self) -> float:
        return self.size_bytes / self.unpadded_bytes if self.unpadded_bytes else 1.0


@dataclass
class OpTotal:
    op_name: str
    size_bytes: int = 0
    unpadded_bytes: int = 0
    buffers: int = 0
    worst_buffer: str = ""
    worst_padding_bytes: int = -1

    @property
    def padding_bytes(self) -> int:
        return max(0, self.size_bytes - self.unpadded_bytes)


from tpuprof.models.suggestion import Suggestion  # noqa: E402,F401  (one model for every command)

# A compile stopped at a memory layout within HBM (a fix's check): not a fit, as code generation adds to it.
LAYOUT_FITS = "the layout fits, and code generation adds to it"


@dataclass
class ModuleMemory:
    name: str
    source: str  # the file it was read from
    source_kind: str  # hlo_proto | buffer_assignment | hlo_text
    target: str | None = None  # TPU generation, when known
    estimated: bool = False  # True when the figures are not the compiler's TPU buffer assignment
    method: str = METHOD_BUFFER_ASSIGNMENT
    expected_error_percent: float | None = None  # for estimates: the largest error measured on real compiles
    peak_range_bytes: tuple[int, int] | None = None  # for unscheduled_bound: where the real peak can land
    notes: list[str] = field(default_factory=list)
    buffers: list[Buffer] = field(default_factory=list)  # HBM buffers, largest first
    ops: list[OpTotal] = field(default_factory=list)
    ops_scope: str = "all"  # "peak": ops over the buffers live at the peak; "all": over every buffer
    peak_heap_bytes: int | None = None
    peak_unpadded_heap_bytes: int | None = None
    argument_bytes: int = 0
    output_bytes: int = 0
    # Outputs written into an argument's buffer (donated, or aliased by the module's input_output_alias): counted in
    # argument_bytes and output_bytes both, as buffer assignments do.
    aliased_bytes: int = 0
    # How many (output, parameter) pairs the module's input_output_alias declares; None where the input does not
    # say (a buffer-assignment text, a proto read without its header).
    alias_pairs: int | None = None
    # Entry parameters (framework op name, else instruction name) that an output of the same dtype and dims could be
    # written over if the step donated them; None where the input does not give the entry's parameters and result.
    donation_candidates: list[str] | None = None
    temp_bytes: int = 0
    # What the program's HBM allocations add up to (thread-local scratch aside), as the runtime reserves them: the
    # arguments, the outputs not written into an argument, and the temporaries' one preallocated block, whose size
    # is the compiler's packing of them and can exceed what is live at once. None where no allocation is known.
    allocated_bytes: int | None = None
    hbm_capacity_bytes: int | None = None
    other_memory_spaces: dict[int, int] = field(default_factory=dict)  # memory space -> bytes
    # Heap over program order (padded, unpadded), indefinite allocations included, as XProf plots it.
    heap_timeline: list[int] = field(default_factory=list)
    unpadded_timeline: list[int] = field(default_factory=list)
    peak_position: int = 0
    suggestions: list[Suggestion] = field(default_factory=list)
    # Where shapes and source lines come from when they are wanted (kept lazy for large modules).
    details_source: object = field(default=None, repr=False, compare=False)

    @property
    def required_bytes(self) -> int | None:
        """What running the program needs in HBM, the fit verdict's figure: its allocations, or the peak where that
        is larger (an estimate has no allocations)."""
        if self.peak_heap_bytes is None:
            return self.allocated_bytes
        return max(self.peak_heap_bytes, self.allocated_bytes or 0)

    @property
    def padding_at_peak_bytes(self) -> int:
        return sum(b.padding_bytes for b in self.buffers if b.live_at_peak)
