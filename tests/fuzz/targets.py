"""The parsers under fuzz: where their samples come from, how an input is mutated, and how it is run.

Each target runs an input the way the CLI does (the command's `run`, analysis and renderer, in-process), so a
crash here is a crash of `tpuprof`. Which output (tables, --json, --csv) an input goes through is chosen from a
checksum of the input itself, so that a saved input replays exactly.
"""

from __future__ import annotations

import json
import random
import tempfile
import zlib
from pathlib import Path

import mutators

ROOT = Path(__file__).resolve().parents[2]
DUMPS = ROOT / "sample_profiles" / "dumps"
CAPTURES = ROOT / "sample_profiles" / "captures"
OOM_TEXTS = sorted((ROOT / "tests" / "fixtures" / "oom").glob("*.txt")) + sorted((ROOT / "sample_profiles" / "oom").glob("*.txt"))
SMALL_DUMPS = ("int8_matmul_v5e", "onehot10_v5e", "conv18_f32_v5e")


def variant(data: bytes, count: int) -> int:
    return zlib.crc32(data) % count


class Target:
    name = ""
    filename = "input"
    stacked = 3  # at most this many mutations on top of each other

    def __init__(self) -> None:
        self.samples: list[bytes] = []

    def load(self) -> None:
        raise NotImplementedError

    def mutate_once(self, rng: random.Random, data: bytes) -> bytes:
        return mutators.mutate_bytes(rng, data, self.samples)

    def mutate(self, rng: random.Random) -> bytes:
        data = rng.choice(self.samples)
        for _ in range(rng.randint(1, self.stacked)):
            data = self.mutate_once(rng, data)
        return data

    def run(self, path: Path, data: bytes) -> None:
        raise NotImplementedError


class TextTarget(Target):
    def load(self) -> None:
        self.texts = [s.decode("utf-8", "replace") for s in self.samples]
        self.dictionary = mutators.words(self.texts)

    def mutate_once(self, rng: random.Random, data: bytes) -> bytes:
        if rng.random() < 0.1:
            return mutators.mutate_bytes(rng, data, self.samples)
        text = data.decode("utf-8", "replace")
        return mutators.mutate_text(rng, text, self.texts, self.dictionary).encode("utf-8", "surrogatepass")


# ------------------------------------------------------------------------------------------- text parsers

class Layouts(TextTarget):
    """Shape and layout strings, as HLO text, buffer-assignment text and OOM messages print them."""
    name = "layout"
    filename = "shape.txt"

    def load(self) -> None:
        import re

        found: dict[str, None] = {}
        pattern = re.compile(r"\(?\b[a-z][a-z0-9]*\[[^\]\n]{0,80}\](?:\{[^{}\n]{0,120}\})?")
        for source in [*DUMPS.glob("*/*.txt"), *OOM_TEXTS]:
            for match in pattern.finditer(source.read_text(errors="replace")):
                found[match.group(0).lstrip("(")] = None
        found.update(dict.fromkeys(["(f32[2,3]{1,0:T(2,128)S(1)}, s32[]{:S(2)}, (bf16[4]{0}))", "token[]",
                                    "f32[<=10,128]{1,0:T(8,128)}", "s4[8,128]{1,0:T(8,128)(8,1)E(4)}", "f32[5]{0:L(16)}"]))
        self.samples = [s.encode() for s in list(found)[:3000]]
        super().load()

    def run(self, path: Path, data: bytes) -> None:
        from tpuprof.analyses.buffers import fill_shape_details
        from tpuprof.models import shape as shapes
        from tpuprof.models.memory import Buffer

        text = data.decode("utf-8", "replace")
        shape = shapes.parse_shape(text)
        for element in (shape.tuple_shapes or (shape,)):
            element.padded_bytes(), element.unpadded_bytes(), element.padded_dims()
            buffer = Buffer(1, "x", "add", "", element.padded_bytes(), element.unpadded_bytes(), "temp")
            fill_shape_details(buffer, element)
        again = shapes.parse_shape(shape.text())
        assert again.padded_bytes() == shape.padded_bytes(), "a shape's text reads back as another size"
        shapes.parse_shape_prefix(f"  %x = {text} add(f32[] %a, f32[] %b)", 7)


class OomText(TextTarget):
    name = "oom_text"
    filename = "oom.log"

    def load(self) -> None:
        self.samples = [p.read_bytes() for p in OOM_TEXTS]
        super().load()

    def run(self, path: Path, data: bytes) -> None:
        from tpuprof.commands import oom

        v = variant(data, 8)
        oom.run(str(path), batch=(None, 64)[v % 2], target=(None, "v5e")[v // 2 % 2], as_json=v < 6)


class BufferAssignment(TextTarget):
    name = "buffer_assignment"
    filename = "module.after_optimizations-buffer-assignment.txt"

    def load(self) -> None:
        # Small samples mutate as well as large ones and run ten times faster.
        self.samples = [p.read_bytes() for p in sorted(DUMPS.glob("*/*-buffer-assignment.txt"))
                        if p.stat().st_size < 20_000]
        super().load()

    def run(self, path: Path, data: bytes) -> None:
        from tpuprof.commands import memory

        v = variant(data, 4)  # tables for a quarter of the inputs: rich's layout is most of a run's time
        memory.run(path, module=None, target=None, compile_=False, top=(15, 0, 0, 3)[v], as_json=v in (1, 3),
                   csv="buffers" if v == 2 else None)


class HloText(TextTarget):
    name = "hlo_text"
    filename = "module.after_optimizations.txt"

    def load(self) -> None:
        files = [DUMPS / name for name in SMALL_DUMPS[:2]]
        self.samples = [p.read_bytes() for f in files for p in f.glob("*.after_optimizations.txt")]
        # HLO without TPU layouts (the estimate's path): the seed article's module and a TF CPU module's first part.
        cpu = (DUMPS / "tf_hlo_cpu" / "tf_conv18.hlo.txt").read_text()
        self.samples += [(ROOT / "tests" / "fixtures" / "memory" / "seed_onehot_hlo.txt").read_bytes(),
                         cpu[:cpu.find("\n}\n", 12_000) + 3].encode()]
        super().load()

    def run(self, path: Path, data: bytes) -> None:
        from tpuprof.commands import memory

        v = variant(data, 8)
        memory.run(path, module=None, target=("v5e", "v6e", None, "v4")[v % 4], compile_=False,
                   top=(15, 0)[v % 2] if v < 6 else 15, as_json=v < 6)


# ------------------------------------------------------------------------------------------- protos

class ProtoTarget(Target):
    proto_share = 0.8  # of the mutations that go through the message classes (the rest: bytes)

    def message_class(self):
        raise NotImplementedError

    def load_messages(self) -> None:
        cls = self.message_class()
        self.messages = [cls.FromString(s) for s in self.samples]
        self.ids = [mutators.id_values(m) for m in self.messages]

    def mutate(self, rng: random.Random) -> bytes:
        i = rng.randrange(len(self.samples))
        if rng.random() >= self.proto_share:
            data = self.samples[i]
            for _ in range(rng.randint(1, self.stacked)):
                data = mutators.mutate_bytes(rng, data, self.samples)
            return data
        message = type(self.messages[i])()
        message.CopyFrom(self.messages[i])
        for _ in range(rng.randint(1, 2 * self.stacked)):
            mutators.mutate_message(rng, message, self.ids[i])
        data = message.SerializeToString()
        if rng.random() < 0.1:
            data = mutators.mutate_bytes(rng, data, self.samples)
        return data[:mutators.MAX_INPUT_BYTES]


class HloProto(ProtoTarget):
    name = "hlo_proto"
    filename = "module.after_optimizations.hlo.pb"

    def message_class(self):
        from tpuprof import protos

        return protos.hlo_pb2().HloProto

    def load(self) -> None:
        self.samples = [p.read_bytes() for name in SMALL_DUMPS for p in (DUMPS / name).glob("*.hlo.pb")]
        # Without a buffer assignment `memory` estimates from the module (analyses/hlo_estimate.py), with the
        # module's donations (input_output_alias) as buffers it shares. The seeds above all carry an assignment and
        # none donates, and the message walk only goes down fields that are set: that path and its aliasing were
        # out of reach. Each seed again without its assignment and donating every parameter an output could reuse,
        # and the Keras step's module (19 donated variables), put them in reach of every mutation.
        hlo_proto = self.message_class()
        donating = next((DUMPS / "keras_mlp_v5e").glob("*.hlo.pb")).read_bytes()
        for data in [*self.samples, donating]:
            message = hlo_proto.FromString(data)
            message.ClearField("buffer_assignment")
            if not message.hlo_module.input_output_alias.entries:
                _donate_what_fits(message.hlo_module)
            self.samples.append(message.SerializeToString())
        self.load_messages()

    def run(self, path: Path, data: bytes) -> None:
        from tpuprof.commands import memory

        v = variant(data, 8)
        memory.run(path, module=None, target=(None, "v5e")[v % 2], compile_=False,
                   top=(15, 0)[v // 2 % 2] if v < 6 else 15, as_json=v < 6, csv="ops" if v == 7 else None)


def _donate_what_fits(module) -> None:
    """Alias each entry parameter to an output of the same shape (as jax.jit(donate_argnums=...) does)."""
    entry = next(c for c in module.computations if c.id == module.entry_computation_id)
    root = next(i for i in entry.instructions if i.id == entry.root_id)
    outputs = list(enumerate(root.shape.tuple_shapes)) if root.shape.tuple_shapes else [(None, root.shape)]
    taken = set()
    for parameter in sorted((i for i in entry.instructions if i.opcode == "parameter"),
                            key=lambda i: i.parameter_number):
        for index, shape in outputs:
            if index not in taken and shape == parameter.shape:
                taken.add(index)
                alias = module.input_output_alias.entries.add()
                alias.output_shape_index.extend([] if index is None else [index])
                alias.parameter_number = parameter.parameter_number
                break


def _trimmed_capture(path: Path, events_per_line: int):
    """A real capture with each line cut to its first events: the same structure, a fraction of the bytes."""
    from tpuprof.protos import xplane_pb2

    space = xplane_pb2().XSpace.FromString(path.read_bytes())
    for plane in space.planes:
        for line in plane.lines:
            del line.events[events_per_line:]
    return space.SerializeToString()


class XPlane(ProtoTarget):
    name = "xplane"
    filename = "host.xplane.pb"

    def message_class(self):
        from tpuprof.protos import xplane_pb2

        return xplane_pb2().XSpace

    @staticmethod
    def synthetic_spaces() -> list[bytes]:
        """Schema-built TPU captures (tests/synthetic_xspace.py): steps, infeed, collectives, a slow chip, FLOPs."""
        import sys

        sys.path.insert(0, str(ROOT / "tests"))
        from helpers.synthetic_xspace import Layout, tpu_xspace

        layouts = [Layout(steps=4), Layout(steps=3, cores=2, infeed_ms=1.0, host_waits_in_idle=True),
                   Layout(steps=3, host_loader_in_idle=True, with_host=True, host_compiles_in_idle=True),
                   Layout(steps=3, collective_ms=0.5, outfeed_ms=0.2, slow_core=0, slow_core_ms=1.0, cores=2,
                          device_type="TPU v5 Lite", matmul_flops=10**9, matmul_bytes=10**6)]
        return [tpu_xspace(layout).SerializeToString() for layout in layouts]

    def load(self) -> None:
        self.samples = self.synthetic_spaces()
        for name in ("jax_recompile", "tf_slow_map"):
            capture = next((CAPTURES / name).rglob("*.xplane.pb"))
            self.samples.append(_trimmed_capture(capture, 40))
        self.load_messages()

    def run(self, path: Path, data: bytes) -> None:
        from tpuprof.commands import analyze

        v = variant(data, 8)
        analyze.run(str(path), top=(10, 0)[v % 2] if v < 6 else 10, as_json=v < 6, csv=("steps" if v == 7 else None))


# ------------------------------------------------------------------------------------------- --json documents

class JsonDocuments(Target):
    """The --json documents `report` and `diff` read: every field of every type, or removed."""
    name = "json"
    filename = "document.json"
    stacked = 2
    full_html_every = 25  # plotly builds each figure in ~50 ms: the other inputs draw the page without them

    def load(self) -> None:
        import contextlib
        import io

        from tpuprof.commands import analyze, memory, oom
        from tpuprof import documents_analyze as render_analyze
        from tpuprof.documents_memory import document as memory_document

        documents = []
        with contextlib.redirect_stdout(io.StringIO()):
            for name in ("int8_matmul_v5e", "onehot10_v5e"):
                documents.append(memory_document(memory.module_memories(DUMPS / name, top=4), 4))
            for name in ("tf_slow_map",):
                documents.append(render_analyze.document(analyze.profile_summary(str(CAPTURES / name), top=4), 4))
            for space in XPlane.synthetic_spaces()[2:]:  # TPU chips: devices, roofline, slow chips
                with tempfile.TemporaryDirectory() as folder:
                    path = Path(folder, "tpu.xplane.pb")
                    path.write_bytes(space)
                    documents.append(render_analyze.document(analyze.profile_summary(str(path), top=4), 4))
            for text in OOM_TEXTS[:6]:
                documents.append(oom.to_document(*oom.explain(str(text))))
        documents.append(json.loads((ROOT / "tests" / "fixtures" / "report" / "preflight_conv18_v5e_b64.json").read_text()))
        self.documents = documents
        self.samples = [json.dumps(d).encode() for d in documents]

    def mutate(self, rng: random.Random) -> bytes:
        document = json.loads(rng.choice(self.samples))
        paths = mutators._paths(document)
        for _ in range(rng.randint(1, self.stacked)):
            document = mutators.mutate_json(rng, document, paths)
            paths = mutators._paths(document)
        return mutators.dump_json(rng, document)

    def run(self, path: Path, data: bytes) -> None:
        from tpuprof.commands import diff, report
        from tpuprof.sources import inputs

        v = variant(data, self.full_html_every)
        with _plotly_figures(draw=v == 0):
            report.run([str(path)], output=path.with_name("report.html"), target=None, top=(5, 0)[v % 2], title=None,
                       as_json=v % 3 == 0)
        try:
            kind = inputs.document_kind(json.loads(data))
        except ValueError:
            kind = None
        for i, document in enumerate(self.documents):
            if kind is not None and inputs.document_kind(document) == kind:
                intact = path.with_name(f"intact{i}.json")
                if not intact.exists():
                    intact.write_text(json.dumps(document))
                fail_if = {"memory": ["peak_heap_bytes>+5%", "temp_bytes>100M"], "steps": ["median_ms>+2"],
                           "preflight": ["required_bytes>+1%"]}.get(kind, [])
                try:
                    diff.run(str(intact), str(path), fail_if=fail_if, batches=None, target=None, top=5,
                             as_json=v % 2 == 0)
                except SystemExit as done:  # exit 1: a threshold tripped, which is what --fail-if is for
                    if done.code != 1:
                        raise
                break


class _plotly_figures:
    """With draw=False, the page's plotly figures are built by a stand-in that takes any call and draws nothing, and
    plotly.js is not embedded: the HTML renderer's own reading of the document still runs whole, at a fraction of
    the cost."""

    def __init__(self, draw: bool):
        self.draw = draw

    def __enter__(self):
        if not self.draw:
            import plotly.graph_objects as go

            from tpuprof.renderers import html

            import plotly.offline

            self.saved = (go.Figure, html._Page.figure, plotly.offline.get_plotlyjs)
            go.Figure = _FigureStandIn
            html._Page.figure = lambda page, fig, height=420: page.add("<div>figure</div>")
            plotly.offline.get_plotlyjs = lambda: "/* plotly.js */"  # 4.8 MB, the same in every page

    def __exit__(self, *exc):
        if not self.draw:
            import plotly.graph_objects as go

            from tpuprof.renderers import html

            import plotly.offline

            go.Figure, html._Page.figure, plotly.offline.get_plotlyjs = self.saved


class _FigureStandIn:
    def __init__(self, *args, **kwargs):
        pass

    def __getattr__(self, name):
        def call(*args, **kwargs):
            for value in kwargs.values():  # materialise lists and generators as plotly would
                if isinstance(value, (list, tuple)):
                    [float(x) for x in value if isinstance(x, (int, float))]
            return self
        return call


TARGETS = {t.name: t for t in (Layouts, OomText, BufferAssignment, HloText, HloProto, XPlane, JsonDocuments)}
