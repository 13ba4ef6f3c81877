"""Find and read profiler captures (`<host>.xplane.pb`, one XSpace per host).

Accepted paths, local or any fsspec URL (gs://...):
- an `.xplane.pb` file;
- a run folder `.../plugins/profile/<run>/` holding one file per host;
- a logdir holding `plugins/profile/<run>/` folders, or the `plugins/profile` folder itself:
  the newest run is read (run folders are named by capture time, YYYY_MM_DD_HH_MM_SS).
"""

from __future__ import annotations

import os
import posixpath
from contextlib import contextmanager
from dataclasses import dataclass

from tpuprof.errors import UserError
from tpuprof.sources import remote, xspace_stream
from tpuprof.sources.xspace_stream import light_xspace_class  # noqa: F401 - part of this module's API

SUFFIX = ".xplane.pb"


class _LocalFS:
    """The three file-system calls `find_capture` makes, for local paths without importing fsspec (60 ms of
    start-up that a local capture does not need)."""

    protocol = "file"

    @staticmethod
    def exists(path: str) -> bool:
        return os.path.exists(path)

    @staticmethod
    def isdir(path: str) -> bool:
        return os.path.isdir(path)

    @staticmethod
    def ls(path: str, detail: bool = False) -> list[str]:
        return sorted(os.path.join(path, name) for name in os.listdir(path))


def _is_local(path: str) -> bool:
    return "://" not in path or path.startswith("file://")


def _fs(path: str):
    if _is_local(path):
        return _LocalFS(), os.path.abspath(path.removeprefix("file://"))
    import fsspec

    remote.quiet_loggers()

    try:
        return fsspec.core.url_to_fs(path)
    except (ImportError, ValueError) as error:  # e.g. gs:// without gcsfs installed
        raise UserError(f"cannot open {path}: {error}.") from None


def _host_files(fs, folder: str) -> list[str]:
    return sorted(p for p in fs.ls(folder, detail=False) if p.endswith(SUFFIX))


def _runs(fs, folder: str) -> list[str]:
    """Sub-folders of `folder` that hold host files, oldest first (names are capture times)."""
    runs = [p for p in fs.ls(folder, detail=False) if fs.isdir(p) and _host_files(fs, p)]
    return sorted(runs, key=posixpath.basename)


@dataclass(frozen=True)
class RunChoice:
    """The run read from a logdir: its folder name, where the runs are, and how many other runs are there."""
    name: str
    folder: str
    others: int


def find_capture(path: str) -> tuple[list[str], RunChoice | None]:
    """The xplane.pb files (one per host) of the capture PATH names (URLs keep their protocol), and for a logdir
    the run it chose (the newest) among how many."""
    path = str(path)
    if not _is_local(path):
        return remote.call(path, "listing the capture", _find_capture, path)
    return _find_capture(path)


def _find_capture(path: str) -> tuple[list[str], RunChoice | None]:
    fs, local = _fs(path)
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]

    def url(p: str) -> str:
        return p if protocol in ("file", "local") else f"{protocol}://{p}"

    try:
        if not fs.exists(local):
            raise UserError(f"{path} does not exist.")
        if not fs.isdir(local):
            return [url(local)], None
        files = _host_files(fs, local)
        if files:
            return [url(f) for f in files], None
        for candidate in (posixpath.join(local, "plugins", "profile"), posixpath.join(local, "profile"), local):
            if fs.isdir(candidate):
                runs = _runs(fs, candidate)
                if runs:
                    chosen = RunChoice(posixpath.basename(runs[-1]), url(candidate), len(runs) - 1)
                    return [url(f) for f in _host_files(fs, runs[-1])], chosen
        # A folder of logdirs (one per job): name a few rather than guess which one was meant.
        logdirs = [posixpath.basename(p) for p in sorted(fs.ls(local, detail=False))
                   if fs.isdir(posixpath.join(p, "plugins", "profile"))]
    except OSError as error:
        raise UserError(f"cannot read {path}: {error}.") from None
    hint = f"; it holds the logdirs {', '.join(logdirs[:4])}{', ...' if len(logdirs) > 4 else ''}: pass one" \
        if logdirs else ""
    raise UserError(f"no profile runs under {path} (expected plugins/profile/<run>/<host>{SUFFIX}){hint}.")


def host_name(path: str) -> str:
    """`.../localhost_6009.xplane.pb` -> `localhost_6009` (the file name is the host's name)."""
    name = posixpath.basename(str(path))
    return name[: -len(SUFFIX)] if name.endswith(SUFFIX) else name


def read_bytes(path: str) -> bytes:
    if _is_local(path):
        try:
            with open(path.removeprefix("file://"), "rb") as handle:
                return handle.read()
        except OSError as error:
            raise UserError(f"cannot read {path}: {error.strerror or error}.") from None
    import fsspec

    remote.quiet_loggers()
    # Each step has the time limit (nothing answers: one sentence within 30 s); a large file takes the chunks it needs.
    try:
        handle = remote.call(path, "opening the capture", fsspec.open(path, "rb").open)
        try:
            chunks = []
            while chunk := remote.call(path, "reading the capture", handle.read, 16 << 20):
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            handle.close()
    except (OSError, ValueError) as error:
        raise UserError(f"cannot read {path}: {str(error).splitlines()[0][:300] if str(error) else error}.") from None


def _looks_like_hlo_proto(data: bytes) -> bool:
    from tpuprof.protos import hlo_pb2

    proto = hlo_pb2().HloProto()
    try:
        proto.ParseFromString(data)
    except Exception:  # noqa: BLE001 - any decode failure just means "not an HloProto"
        return False
    return bool(proto.hlo_module.name) and len(proto.hlo_module.computations) > 0


def event_stats(event) -> list:
    """An event's stats as XStat messages, from either the real or the light XSpace."""
    from tpuprof.protos import xplane_pb2

    from google.protobuf.message import DecodeError

    stats = list(event.stats)
    if stats and isinstance(stats[0], bytes):
        xstat = xplane_pb2().XStat
        try:
            return [xstat.FromString(raw) for raw in stats]
        except DecodeError:
            raise UserError("an event's stats in the capture are not readable XStat messages: the xplane.pb is "
                            "damaged.") from None
    return stats


def parse_xspace(data: bytes, path: str = "<bytes>", light: bool = True):
    """XSpace from bytes, or a UserError that says what the file is instead."""
    from google.protobuf.message import DecodeError

    from tpuprof.protos import xplane_pb2

    space = light_xspace_class()() if light else xplane_pb2().XSpace()
    try:
        space.ParseFromString(data)
        ok = len(space.planes) > 0 and all(p.name for p in space.planes)
        # A foreign proto can decode as an XSpace with garbage planes: real planes are named
        # "/host:...", "/device:..." or "Task Environment" and their events use known metadata.
        ok = ok and any(p.name.startswith(("/host:", "/device:")) for p in space.planes)
    except DecodeError:
        ok = False
    if ok:
        return space
    if _looks_like_hlo_proto(data):
        raise UserError(f"{path} is an HloProto (an XLA dump), not a profile: use `tpuprof memory` on it.")
    if not data:
        raise UserError(f"{path} is empty: the capture did not finish writing.")
    from tpuprof.sources.binary import copied_as_text

    why = copied_as_text(data)
    raise UserError(f"{path} is not a readable xplane.pb: {why}" if why else
                    f"{path} is not a readable xplane.pb (truncated, or not a profiler capture).")


# Files up to this size that are not captures are read whole to say what they are instead (an HloProto).
_SNIFF_LIMIT_BYTES = 256 << 20


def open_stream(path: str):
    """One host's capture as a sources.xspace_stream.XSpaceStream (read plane by plane, batch by batch), once its
    top level is known to be an XSpace; else the UserError `parse_xspace` gives (empty, an HloProto, unreadable)."""
    from tpuprof.sources.xspace_stream import CorruptCapture, XSpaceStream

    space = XSpaceStream(path)
    try:
        names = space.plane_names()
        ok = bool(names) and all(names) and any(n.startswith(("/host:", "/device:")) for n in names)
    except CorruptCapture:
        ok = False
    if ok:
        return space
    size = space.size
    space.close()
    if size and size <= _SNIFF_LIMIT_BYTES:
        parse_xspace(read_bytes(path), path)  # raises the error that says what the file is
    if not size:
        raise UserError(f"{path} is empty: the capture did not finish writing.")
    raise UserError(f"{path} is not a readable xplane.pb (truncated, or not a profiler capture).")


@contextmanager
def readable(path: str):
    """Turns a malformed record met while streaming the capture into the one-sentence error."""
    from tpuprof.sources.xspace_stream import CorruptCapture

    try:
        yield
    except CorruptCapture:
        raise UserError(f"{path} is not a readable xplane.pb (truncated, or not a profiler capture).") from None


def read_xspace(path: str):
    """One host's XSpace. The bytes are dropped as soon as they are parsed (large files)."""
    return parse_xspace(read_bytes(path), path)


MISSING = xspace_stream.MISSING  # int_stat_values: the event has no such stat


def int_stat_values(events, stat_ids: dict[str, int]) -> dict[str, "object"]:
    """Integer stats of every event of a line, vectorised: {name: int64 array, MISSING where an event lacks it}.

    The light XSpace keeps each event's stats as serialized XStat bytes. Decoding them one by one costs
    about 1.5 us per stat in Python; here all of a line's stats are joined into one buffer and their
    `metadata_id` and integer value (uint64_value, int64_value or ref_value) are read with numpy.
    """
    import numpy as np

    n = len(events)
    result = {name: np.full(n, MISSING, dtype=np.int64) for name in stat_ids}
    if not n or not stat_ids:
        return result
    stats = next((event.stats for event in events if len(event.stats)), [])
    if not stats:
        return result
    if not isinstance(stats[0], bytes):  # a real XSpace (tests, schema-built captures): decode directly
        by_id = {key: name for name, key in stat_ids.items()}
        for i, event in enumerate(events):
            for stat in event.stats:
                name = by_id.get(stat.metadata_id)
                if name is not None:
                    kind = stat.WhichOneof("value")
                    result[name][i] = int(getattr(stat, kind)) if kind in ("int64_value", "uint64_value",
                                                                             "ref_value") else 0
        return result
    return xspace_stream.int_stats_of(events, stat_ids)


