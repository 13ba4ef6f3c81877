"""`tpuprof analyze` on large host files: the XSpace is streamed (sources/xspace_stream.py), not parsed whole.

Ground truth is the full protobuf parse (tsl's own XSpace class) of the same bytes; the large files are real
captures concatenated (a valid XSpace: repeated `planes` fields append), so what is in them is known.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, SAMPLES
from helpers.real_data import REAL_TPU_CAPTURES, real_artefact
from test_capture import gcs_emulator  # noqa: F401 - the module's fixture: a real GCS emulator on loopback

from tpuprof.protos import xplane_pb2
from tpuprof.sources import xplane
from tpuprof.sources.xspace_stream import XSpaceStream, event_arrays


def sample(name: str) -> Path:
    return next((SAMPLES / "captures" / name).rglob("*.xplane.pb"))


@pytest.fixture(scope="module")
def v6e(tmp_path_factory) -> Path:
    return real_artefact(REAL_TPU_CAPTURES["v6e_4_host_offload"], tmp_path_factory.mktemp("v6e"))


def copies(source: Path, count: int, into: Path) -> Path:
    """COUNT copies of a capture, concatenated: one valid XSpace holding each plane COUNT times."""
    data = source.read_bytes()
    into.parent.mkdir(parents=True, exist_ok=True)
    with open(into, "wb") as handle:
        for _ in range(count):
            handle.write(data)
    return into


@pytest.mark.parametrize("name, batch_bytes", [("tf_tiny_spe64", 2000), ("v6e", 1 << 22)])
def test_stream_reads_every_event_and_stat_as_the_full_parse(v6e, name, batch_bytes):
    """Cut into runs of ~2000 bytes (lines walked record by record) or whole lines: same planes, lines, events and
    stats as protobuf's parse of the whole file, for a TF host capture and a real 4-chip v6e capture."""
    for path in ([v6e] if name == "v6e" else [sample(name)]):
        whole = xplane_pb2().XSpace.FromString(path.read_bytes())
        with XSpaceStream(str(path)) as space:
            planes = list(space.planes())
            assert [p.name for p in planes] == space.plane_names() == [p.name for p in whole.planes]
            for plane, real in zip(planes, whole.planes):
                assert dict(plane.header.event_metadata) == dict(real.event_metadata)
                assert list(plane.header.stats) == list(real.stats)
                lines = list(plane.lines())
                assert [(l.id, l.label, l.timestamp_ns) for l in lines] == \
                    [(l.id, l.name or l.display_name or str(l.id), l.timestamp_ns) for l in real.lines]
                for line, real_line in zip(lines, real.lines):
                    batches = list(line.event_batches(batch_bytes))
                    messages = list(line.batches(batch_bytes))
                    assert [len(b) for b in batches] == [len(m.events) for m in messages]
                    if batch_bytes < 5000 and real_line.ByteSize() > 3 * batch_bytes:
                        assert len(batches) > 1
                    columns = [np.concatenate(c) if c else np.zeros(0, np.int64) for c in
                               zip(*[(b.offset_ps, b.duration_ps, b.metadata_id) for b in batches])] or [[]] * 3
                    upb = [np.concatenate(c) if c else [] for c in zip(*map(event_arrays, messages))] or [[]] * 3
                    events = real_line.events
                    assert list(columns[0]) == list(upb[0]) == [e.offset_ps for e in events]
                    assert list(columns[1]) == [e.duration_ps for e in events]
                    assert list(columns[2]) == [e.metadata_id for e in events]
                    stats = [s for b in batches for s in (b.stats(i) for i in range(len(b)))]
                    assert stats == [[x.SerializeToString() for x in e.stats] for e in events]


def test_int_stats_of_a_batch_match_each_events_stats(v6e):
    with XSpaceStream(str(v6e)) as space:
        plane = next(space.planes())
        ids = {m.name: k for k, m in plane.header.stat_metadata.items()
               if m.name in ("device_offset_ps", "device_duration_ps")}
        line = next(line for line in plane.lines() if line.name == "XLA Ops")
        batch = next(line.event_batches())
        values = batch.int_stats(ids)
        expected = {name: [next((s.int64_value or s.uint64_value for s in xplane.event_stats(
            type("E", (), {"stats": batch.stats(i)})) if s.metadata_id == key), xplane.MISSING)
            for i in range(len(batch))] for name, key in ids.items()}
        assert len(ids) == 2 and {k: list(v) for k, v in values.items()} == expected
        some = np.arange(0, len(batch), 3)
        assert {k: list(v) for k, v in batch.int_stats(ids, some).items()} == \
            {k: [v[i] for i in some] for k, v in expected.items()}


def test_memory_does_not_grow_with_the_file(tmp_path, v6e, monkeypatch):
    """8 and 40 copies of the real v6e capture (32 and 160 TPU chips; 7 and 34 MB), every chip read again in the
    second pass: peak RSS grows by under 0.3 bytes per byte of file (the whole-file parse grew by 5.8; what grows
    is each chip's steps, which the report holds). The steps and op times are the copies' own, and keeping the chips
    in memory between the passes gives the same report."""
    from tpuprof.analyses import chips
    from tpuprof.commands import analyze

    few = copies(v6e, 8, tmp_path / "few" / "host.xplane.pb")
    many = copies(v6e, 40, tmp_path / "many" / "host.xplane.pb")
    code = ("import json, resource, sys; from tpuprof.commands import analyze\n"
            "report = analyze.result(sys.argv[1]).to_dict()\n"
            "print(json.dumps([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, report]))")
    rss, reports = {}, {}
    for name, path in (("few", few), ("many", many)):
        done = subprocess.run([sys.executable, "-c", code, str(path)], cwd=ROOT, capture_output=True, text=True,
                              timeout=600, env={**os.environ, "TPUPROF_KEPT_EVENTS": "0"})
        assert done.returncode == 0, done.stderr[-2000:]
        rss[name], reports[name] = json.loads(done.stdout)
    growth_bytes = (rss["many"] - rss["few"]) * 1024
    file_growth = many.stat().st_size - few.stat().st_size
    assert growth_bytes < 0.3 * file_growth, (rss, file_growth)
    few_report, many_report = reports["few"], reports["many"]
    assert len(many_report["devices"]) == 5 * len(few_report["devices"]) == 160
    assert many_report["hosts"][0]["median_ms"] == few_report["hosts"][0]["median_ms"]
    assert [(op["name"], op["self_ms_per_step"]) for op in many_report["top_ops"]] == \
        [(op["name"], op["self_ms_per_step"]) for op in few_report["top_ops"]]
    monkeypatch.setattr(chips, "KEPT_EVENTS", 10**9)
    assert analyze.result(str(few)).to_dict() == few_report


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tpuprof", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.subprocess
def test_truncated_or_damaged_deep_inside_is_one_sentence_and_exit_2(tmp_path, v6e):
    """A file cut short (the last plane's record runs past the end), and one whose damage sits inside an event of
    its last TPU plane, found only while streaming: one sentence on stderr, exit 2."""
    data = copies(v6e, 3, tmp_path / "three.xplane.pb").read_bytes()
    truncated = tmp_path / "cut" / "host.xplane.pb"
    truncated.parent.mkdir()
    truncated.write_bytes(data[: len(data) - 1000])
    # In the last copy's first TPU plane, an `XLA Ops` event's duration field (tag 0x18) becomes wire type 7.
    damaged = bytearray(data)
    with XSpaceStream(bytes(data)) as space:
        start, end = space.plane_extents()[-7]
    at = bytes(damaged).index(b"XLA Ops", start, end)
    at = bytes(damaged).index(b"\x18", at + 200, end)
    damaged[at] = 0x1F
    broken = tmp_path / "broken" / "host.xplane.pb"
    broken.parent.mkdir()
    broken.write_bytes(bytes(damaged))
    for path in (truncated, broken):
        done = run_cli("analyze", str(path))
        assert done.returncode == 2, done.stderr
        assert done.stderr.strip().splitlines() == [f"tpuprof: {path} is not a readable xplane.pb (truncated, or "
                                                    "not a profiler capture)."], done.stderr


def test_gs_capture_streams_in_blocks(tmp_path, gcs_emulator, monkeypatch):  # noqa: F811 - the imported fixture
    """A capture on a real GCS emulator is read in 64 KiB blocks, at most two held at once, and gives the same
    report as the local file."""
    import fsspec

    from tpuprof.commands import analyze
    from tpuprof.sources import xspace_stream

    local = copies(sample("jax_slow_loader"), 3, tmp_path / "run" / "host.xplane.pb")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator)
    fs = fsspec.filesystem("gs", skip_instance_cache=True)
    fs.pipe("tpuprof-test/scale/plugins/profile/2026_01_01_00_00_00/host.xplane.pb", local.read_bytes())
    monkeypatch.setattr(xspace_stream, "REMOTE_BLOCK_BYTES", 64 << 10)
    held = []
    original = xspace_stream._RemoteBytes._block

    def block(self, index):
        result = original(self, index)
        held.append(sum(map(len, self._blocks.values())))
        return result

    monkeypatch.setattr(xspace_stream._RemoteBytes, "_block", block)
    remote = analyze.result("gs://tpuprof-test/scale").to_dict()
    local_report = analyze.result(str(local)).to_dict()
    assert len(held) > 3 and max(held) <= 2 * (64 << 10)
    for document in (remote, local_report):
        for host in document["hosts"]:
            host.pop("file")
            host.pop("host")
        document.pop("path", None)
        document.pop("run", None)
    assert remote["hosts"] == local_report["hosts"] and remote["hosts"][0]["steps"] > 1
