"""Find and read profiler captures (`<host>.xplane.pb`, one XSpace per host).

Accepted paths, local or any fsspec URL (gs://...):
- an `.xplane.pb` file;
- a run folder `.../plugins/profile/<run>/` holding one file per host;
- a logdir holding `plugins/profile/<run>/` folders, or the `plugins/profile` folder itself:
  the newest run is read (run folders are named by capture time, YYYY_MM_DD_HH_MM_SS).
"""

from __future__ import annotations

import posixpath

from tpuprof.errors import UserError

SUFFIX = ".xplane.pb"


def _fs(path: str):
    import fsspec

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


def find_host_files(path: str) -> list[str]:
    """The xplane.pb files (one per host) of the capture PATH names; URLs keep their protocol."""
    path = str(path)
    fs, local = _fs(path)
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]

    def url(p: str) -> str:
        return p if protocol in ("file", "local") else f"{protocol}://{p}"

    try:
        if not fs.exists(local):
            raise UserError(f"{path} does not exist.")
        if not fs.isdir(local):
            return [url(local)]
        files = _host_files(fs, local)
        if files:
            return [url(f) for f in files]
        for candidate in (posixpath.join(local, "plugins", "profile"), local):
            if fs.isdir(candidate):
                runs = _runs(fs, candidate)
                if runs:
                    return [url(f) for f in _host_files(fs, runs[-1])]
    except OSError as error:
        raise UserError(f"cannot read {path}: {error}.") from None
    raise UserError(f"no profile runs under {path} (expected plugins/profile/<run>/<host>{SUFFIX}).")


def host_name(path: str) -> str:
    """`.../localhost_6009.xplane.pb` -> `localhost_6009` (the file name is the host's name)."""
    name = posixpath.basename(str(path))
    return name[: -len(SUFFIX)] if name.endswith(SUFFIX) else name


def read_bytes(path: str) -> bytes:
    import fsspec

    try:
        with fsspec.open(path, "rb") as handle:
            return handle.read()
    except (OSError, ValueError) as error:
        raise UserError(f"cannot read {path}: {error}.") from None


def _looks_like_hlo_proto(data: bytes) -> bool:
    from tpuprof.protos import hlo_pb2

    proto = hlo_pb2().HloProto()
    try:
        proto.ParseFromString(data)
    except Exception:  # noqa: BLE001 - any decode failure just means "not an HloProto"
        return False
    return bool(proto.hlo_module.name) and len(proto.hlo_module.computations) > 0


def parse_xspace(data: bytes, path: str = "<bytes>"):
    """XSpace from bytes, or a UserError that says what the file is instead."""
    from google.protobuf.message import DecodeError

    from tpuprof.protos import xplane_pb2

    space = xplane_pb2().XSpace()
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
    raise UserError(f"{path} is not a readable xplane.pb (truncated, or not a profiler capture).")


def read_xspace(path: str):
    """One host's XSpace. The bytes are dropped as soon as they are parsed (large files)."""
    return parse_xspace(read_bytes(path), path)
