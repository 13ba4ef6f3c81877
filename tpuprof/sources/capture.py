"""Capture a profile from running profiler servers into logdir/plugins/profile/<run>/<host>.xplane.pb.

Client: XProf's `xprof.convert._pywrap_profiler_plugin.trace`. TensorFlow's
`tf.profiler.experimental.client.trace` is a thin wrapper that ends in the very same C++ call
(CaptureRemoteTrace: service_addr, logdir, worker_list, include_dataset_ops, duration_ms,
num_tracing_attempts, options) but imports all of TensorFlow first (3-5 s). XProf is where the
profiler is maintained now, it is already a pinned dependency (tensorboard-plugin-profile==2.24.*)
and its own capture button calls this function, so we use it; the leading underscore is covered by
that pin.

Never overwrite, never half-write: the client writes into a temporary folder inside the logdir (same
file system), and the finished run folder is renamed into plugins/profile/ under a name that does
not exist yet. For gs:// (any fsspec URL) the run is captured locally, then uploaded with fsspec;
object stores write each object whole, so no reader sees half a file.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from tpuprof.errors import UserError

PROFILE_DIR = ("plugins", "profile")


@dataclass
class TraceOptions:
    duration_ms: int = 2000
    attempts: int = 3
    delay_ms: int = 0
    host_tracer_level: int = 2  # 1 user annotations only, 2 + framework ops (XProf's default), 3 verbose
    device_tracer_level: int = 1  # 0 off, 1 on
    python_tracer_level: int = 0  # 1 traces every Python call: large and slow, off by default

    def as_client_options(self) -> dict:
        return {
            "host_tracer_level": self.host_tracer_level,
            "device_tracer_level": self.device_tracer_level,
            "python_tracer_level": self.python_tracer_level,
            "delay_ms": self.delay_ms,
        }


@dataclass
class HostFile:
    host: str  # from the file name: "localhost_6009" for localhost:6009
    path: str  # final location (local path or URL)
    size_bytes: int
    events: int
    planes: int


@dataclass
class CapturedRun:
    """A run the profiler wrote: its folder, the host files in it, and how the capture went."""

    run: str  # run folder name
    run_dir: str  # logdir/plugins/profile/<run>
    logdir: str
    addresses: list[str]
    hosts: list[HostFile] = field(default_factory=list)
    attempts_used: int = 1
    seconds: float = 0.0
    # Addresses with no event in the run: the client succeeds as soon as one host sent a trace.
    silent: list[str] = field(default_factory=list)
    # Servers on other machines (pod workers): each wrote its file where it runs; not read here.
    elsewhere: list[ElsewhereHost] = field(default_factory=list)


def parse_duration_ms(text: str, allow_zero: bool = False) -> int:
    """'2s', '500ms', '1.5s', '1m', or a bare number of seconds -> milliseconds."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s|sec|m|min)?\s*", str(text).lower())
    if not match:
        raise UserError(f"'{text}' is not a duration: use e.g. 2s, 500ms or 1m.")
    value = float(match.group(1))
    unit = match.group(2) or "s"
    ms = value * {"ms": 1, "s": 1000, "sec": 1000, "m": 60000, "min": 60000}[unit]
    if ms < 1 and not (allow_zero and ms == 0):
        raise UserError(f"A duration of '{text}' is too short: trace for at least 1ms (2s suits a TPU job).")
    if ms > 3_600_000:
        raise UserError(f"A duration of '{text}' is over an hour: the profiler keeps the trace in host memory; use at most a few minutes.")
    return int(round(ms))


def is_remote(logdir: str) -> bool:
    return "://" in logdir and not logdir.startswith("file://")


def on_this_machine(address: str) -> bool:
    """Whether the profiler server at ADDRESS runs on this machine, so that it writes to this machine's disk:
    a loopback name, or an address this machine can bind (one of its own)."""
    import ipaddress
    import socket

    from tpuprof.sources.addresses import split_host_port

    host, _ = split_host_port(address)
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return False
    for family, _, _, _, sockaddr in infos:
        ip = sockaddr[0].split("%")[0]
        if ipaddress.ip_address(ip).is_loopback:
            return True
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((sockaddr[0], 0))
                return True
            except OSError:
                continue
    return False


@dataclass
class ElsewhereHost:
    """A profiler server on another machine: it writes its trace to its own disk (or to a gs:// logdir itself)."""
    address: str
    where: str  # the folder on that host (or the bucket) that holds the run
    fetch: str  # a command that brings it here


# ----------------------------------------------------------------------------------------------
# The client call


@contextmanager
def _native_output_to(path: str):
    """Send what the C++ client prints on fds 1 and 2 to a file: keeps --json stdout clean and the
    terminal free of glog lines; the file is read afterwards for the cause of a failure."""
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.dup2(target, 1)
        os.dup2(target, 2)
        yield saved
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, target):
            os.close(fd)


def _client_trace():
    try:
        from xprof.convert import _pywrap_profiler_plugin
    except ImportError as error:
        raise UserError(f"XProf's profiler client is not available ({error}); "
                        "pip install 'tensorboard-plugin-profile==2.24.*'.") from None
    return _pywrap_profiler_plugin.trace


@contextmanager
def _client_warnings_logged():
    """Let the client log its warnings: only they name what each server answered (UNIMPLEMENTED from a gRPC server
    without the profiler service, an HTTP reply from a web server); its exception says "no trace event" whatever
    the cause. `tpuprof` quiets libraries with TF_CPP_MIN_LOG_LEVEL=3 and GRPC_VERBOSITY=ERROR (gRPC sets absl's
    level from it), read when the client first logs: so they are relaxed before it is loaded. Its lines go to the
    client's log file, never the terminal."""
    wanted = {"TF_CPP_MIN_LOG_LEVEL": ("1", lambda v: v.isdigit() and int(v) <= 1),
              "GRPC_VERBOSITY": ("INFO", lambda v: v.upper() in ("DEBUG", "INFO"))}
    before = {name: os.environ.get(name) for name in wanted}
    for name, (value, enough) in wanted.items():
        if before[name] is None or not enough(before[name]):
            os.environ[name] = value
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def run_client(service_addr: str, worker_list: str, logdir: str, options: TraceOptions,
               log_path: str, on_start: Optional[Callable[[tuple[int, int]], None]] = None) -> None:
    """One blocking CaptureRemoteTrace call; raises RuntimeError with the client's status text.

    `on_start(saved_fds)` runs once the native output is redirected: a progress display started
    there can keep writing to the real terminal through the saved fds.
    """
    with _client_warnings_logged():
        trace = _client_trace()
        with _native_output_to(log_path) as saved:
            if on_start:
                on_start(saved)
            trace(service_addr, logdir, worker_list, True, options.duration_ms, options.attempts,
                  options.as_client_options())


def attempts_started(log_path: str) -> int:
    """How many tracing attempts the client has begun (it prints one line per attempt)."""
    try:
        return Path(log_path).read_text(errors="replace").count("Starting to trace for")
    except OSError:
        return 0


# The client logs each server's own answer ("localhost:9012 returned UNIMPLEMENTED: Method not found!"); the
# exception it raises says only that no trace event came back, whatever the servers answered.
SERVER_ANSWER = re.compile(r"\] (\S+) returned ([A-Z_]+): ([^\n]*)")
# What gRPC reports when the port speaks HTTP but not gRPC: an HTTP/1 server (TensorBoard, XProf's page, Jupyter),
# or an HTTP/2 one that answers with a status page.
NOT_GRPC = re.compile(r"Failed parsing HTTP/2|Received http2 header with status")


START_LINES = ("TF: tf.profiler.experimental.server.start(PORT); JAX: jax.profiler.start_server(PORT); "
               "PyTorch/XLA: torch_xla.debug.profiler.start_server(PORT)")


def explain_failure(error: Exception, log_text: str, addresses: list[str], options: TraceOptions) -> UserError:
    """The client's status text plus its log -> one or two sentences with the cause and the fix."""
    text = f"{error}\n{log_text}"
    where = ", ".join(addresses)
    if "Domain name not found" in text or "errors resolving" in text or "DNS resolution failed" in text:
        return UserError(f"Cannot resolve {where} (DNS lookup failed): check the host name, or pass the worker's "
                         "IP with --service-addr IP:PORT.")
    answers = {address: (code, detail) for address, code, detail in SERVER_ANSWER.findall(log_text)}
    web = [a for a, (_, detail) in answers.items() if NOT_GRPC.search(detail)]
    if web:
        return UserError(f"{', '.join(web)} answers HTTP, not the profiler's gRPC: it is a web server (TensorBoard, "
                         "XProf's viewer, Jupyter...), not the job's profiler server; point at the port the job "
                         f"passed to its profiler server ({START_LINES}).")
    other_service = [a for a, (code, _) in answers.items() if code == "UNIMPLEMENTED"]
    if other_service:
        return UserError(f"The server at {', '.join(other_service)} does not offer the profiler service: point at "
                         f"the port the job passed to its profiler server ({START_LINES}), not "
                         "the TPU runtime's port 8470 or another gRPC service.")
    if "Connection refused" in text or "failed to connect to all addresses" in text:
        return UserError(f"Nothing is listening at {where} any more (connection refused during the capture): "
                         "the job may have exited; start it again with its profiler server on.")
    if "No trace event" in text or "empty_trace" in text or "did not have trace data" in text:
        seconds = options.duration_ms / 1000
        if options.host_tracer_level == 0:  # the options, not the job, may be why nothing came back
            traced = ("with --host-tracer-level 0 and --device-tracer-level 0 nothing was traced"
                      if options.device_tracer_level == 0 else "with --host-tracer-level 0 only the devices were "
                      "traced, and a job on CPU, or between device programs, gives no event")
            return UserError(
                f"No trace event was collected from {where} after {options.attempts} attempt(s) of {seconds:g}s: "
                f"{traced}; capture with the default levels (--host-tracer-level 2 --device-tracer-level 1).")
        return UserError(
            f"No trace event was collected from {where} after {options.attempts} attempt(s) of {seconds:g}s: "
            "the job may be idle, between steps or still compiling; capture while it trains, or raise "
            "--duration / --attempts."
        )
    if "DEADLINE_EXCEEDED" in text:
        return UserError(f"The profiler at {where} did not answer in time: the host may be overloaded or the "
                         "trace too large; try a shorter --duration.")
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return UserError(f"The capture from {where} failed: {first[:300]}")


# ----------------------------------------------------------------------------------------------
# Placing the finished run


def unique_run_name(wanted: str, exists: Callable[[str], bool]) -> str:
    """`wanted`, or `wanted_2`, `wanted_3`... : the first name not taken (never overwrite a run)."""
    if not exists(wanted):
        return wanted
    n = 2
    while exists(f"{wanted}_{n}"):
        n += 1
    return f"{wanted}_{n}"


def captured_run(tmp_logdir: str) -> tuple[str, Path]:
    """The one run folder the client wrote inside the temporary logdir."""
    root = Path(tmp_logdir, *PROFILE_DIR)
    runs = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    files = [f for run in runs for f in run.glob("*.xplane.pb")]
    if not runs or not files:
        raise UserError("The profiler client reported success but wrote no xplane.pb: capture again, "
                        "and check the job is still training.")
    return runs[-1].name, runs[-1]


def place_local(run_folder: Path, wanted: str, logdir: str) -> str:
    """Rename the finished run into logdir/plugins/profile/ under an unused name; return its path.

    One rename of the whole folder: readers see either no run or the complete run."""
    profile = Path(logdir, *PROFILE_DIR)
    try:
        profile.mkdir(parents=True, exist_ok=True)
        while True:
            final = profile / unique_run_name(wanted, lambda n: (profile / n).exists())
            try:
                os.rename(run_folder, final)  # fails on a non-empty existing folder: never overwrites a run
                return str(final)
            except OSError:
                if not final.exists():
                    raise
                # a concurrent capture took the name between the check and the rename: pick the next
    except OSError as error:
        raise UserError(f"Cannot write the run into {profile}: {error.strerror or error}.") from None


def _remote_fs(logdir: str):
    import logging

    import fsspec

    # gcsfs logs a warning per call when it cannot ask for the bucket type without credentials.
    logging.getLogger("gcsfs").setLevel(logging.ERROR)
    try:
        fs, root = fsspec.core.url_to_fs(logdir)
    except (ImportError, ValueError) as error:
        raise UserError(f"Cannot write to {logdir}: {error} (for gs:// install gcsfs).") from None
    return fs, root.rstrip("/")


def place_remote(run_folder: Path, wanted: str, logdir: str) -> str:
    """Upload the finished run to logdir/plugins/profile/<unused name>/ with fsspec; return its URL. Connecting and
    listing have the time limit of tpuprof.sources.remote (nothing answers: one sentence within 30 s); the
    upload itself takes what the files need."""
    from tpuprof.sources import remote

    fs, root = remote.call(logdir, "connecting", _remote_fs, logdir)
    profile = "/".join([root, *PROFILE_DIR])
    try:
        taken = remote.call(logdir, "listing the logdir", lambda: {
            p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(profile, detail=False)} if fs.exists(profile) else set())
        name = unique_run_name(wanted, lambda n: n in taken)
        target = f"{profile}/{name}"
        for item in sorted(run_folder.iterdir()):
            fs.put_file(str(item), f"{target}/{item.name}")
    except UserError:
        raise
    except Exception as error:  # noqa: BLE001 - gcsfs raises HttpError, OSError, auth errors...
        raise UserError(f"Uploading the capture to {logdir} failed: {str(error).splitlines()[0][:300]} "
                        f"(the local copy was removed; check credentials and the bucket name).") from None
    protocol = fs.protocol[0] if isinstance(fs.protocol, (tuple, list)) else fs.protocol
    return f"{protocol}://{target}"


def describe_host_files(run_folder: Path) -> list[HostFile]:
    """File size and event count of each host file, read before it is published (no download later).
    `path` is the bare file name until the run has its final place."""
    from tpuprof.sources import xplane

    hosts = []
    for path in sorted(run_folder.glob("*.xplane.pb")):
        # Streamed, a run of events at a time: a pod host's file can be gigabytes (memory stays bounded).
        with xplane.open_stream(str(path)) as space, xplane.readable(str(path)):
            events = sum(len(batch.events) for plane in space.planes() for line in plane.lines()
                         for batch in line.batches())
            planes = len(space.plane_extents())
        host = path.name[: -len(".xplane.pb")]
        hosts.append(HostFile(host, path.name, space.size, events, planes))
    return hosts


def _silent_hosts(addresses: list[str], hosts: list[HostFile]) -> list[str]:
    """Addresses that gave no event: an idle worker writes an empty file, a lost one none at all.
    The client names files host_port; TPU Node sessions use hostnames, so there only counts are trusted."""
    by_name = {h.host: h for h in hosts}
    silent = []
    for address in addresses:
        host = by_name.get(address.replace("[", "").replace("]", "").replace(":", "_"))
        if (host is None and len(hosts) < len(addresses)) or (host is not None and host.events == 0):
            silent.append(address)
    if not silent and len(hosts) < len(addresses):
        silent = [f"{len(addresses) - len(hosts)} of {len(addresses)} hosts"]
    return silent


# ----------------------------------------------------------------------------------------------
# The whole capture


def capture(addresses: list[str], logdir: str, options: TraceOptions, tpu_master: Optional[str] = None,
            on_start: Optional[Callable[[tuple[int, int], str], None]] = None) -> CapturedRun:
    """Trace every address in one client call (the hosts share one start time, so runs line up).

    Each profiler server writes its own trace, to the path the client passes, resolved in the server's working
    directory and on the server's disk: the path is made absolute here (the job runs in another folder), and
    servers on other machines are reported with where their file is and how to fetch it."""
    started = time.monotonic()
    remote = is_remote(logdir)
    if not remote:
        logdir = os.path.abspath(os.path.expanduser(logdir[len("file://"):] if logdir.startswith("file://") else logdir))
    elsewhere = [a for a in addresses if not on_this_machine(a)]
    if elsewhere:
        return _capture_with_other_machines(addresses, elsewhere, logdir, options, tpu_master, on_start, started)
    made: list[Path] = []  # the folders this capture creates, deepest first: removed again unless a run lands
    if remote:
        _remote_fs(logdir)  # a missing gcsfs or a bad URL fails before the job is traced
        scratch_parent = None
    else:
        scratch_parent = Path(logdir)
        made = _missing_folders(Path(logdir, *PROFILE_DIR))
        try:
            scratch_parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise UserError(f"Cannot create the logdir {logdir}: {error.strerror}.") from None
    # Same file system as the logdir, so the final rename is atomic; a dot name so TensorBoard skips it.
    scratch = tempfile.mkdtemp(prefix=".tpuprof-capture-", dir=scratch_parent)
    log_path = os.path.join(scratch, "client.log")
    client_logdir = os.path.join(scratch, "logdir")
    try:
        _trace_all(addresses, client_logdir, options, tpu_master, log_path, on_start)
        wanted, run_folder = captured_run(client_logdir)
        hosts = describe_host_files(run_folder)  # also proves each file parses before it is published
        final_dir = place_remote(run_folder, wanted, logdir) if remote else place_local(run_folder, wanted, logdir)
        for host in hosts:
            host.path = f"{final_dir.rstrip('/')}/{host.path}"
        return CapturedRun(
            run=final_dir.rstrip("/").rsplit("/", 1)[-1],
            run_dir=final_dir,
            logdir=logdir,
            addresses=list(addresses),
            hosts=hosts,
            attempts_used=max(1, attempts_started(log_path)),
            seconds=time.monotonic() - started,
            silent=_silent_hosts(addresses, hosts),
        )
    except BaseException:  # a failure or Ctrl-C: no run, and no empty folder where the user had none
        shutil.rmtree(scratch, ignore_errors=True)
        _remove_empty(made)
        raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _missing_folders(path: Path) -> list[Path]:
    """PATH and its parents that do not exist yet, deepest first: what `mkdir(parents=True)` would create."""
    missing = []
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    return missing


def _remove_empty(folders: list[Path]) -> None:
    for folder in folders:
        try:
            folder.rmdir()  # only an empty folder: anything else the logdir holds by now stays
        except FileNotFoundError:
            continue
        except OSError:
            return


def _trace_all(addresses: list[str], client_logdir: str, options: TraceOptions, tpu_master: Optional[str],
               log_path: str, on_start: Optional[Callable]) -> None:
    """The client call(s) that trace every address into CLIENT_LOGDIR; a failure is one sentence."""
    start_hook = (lambda saved: on_start(saved, log_path)) if on_start else None
    try:
        if tpu_master and len(addresses) > 1:
            # A TPU Node's profiler service runs one session over all workers (XProf's way);
            # servers started by a job (TPU VMs) answer UNIMPLEMENTED: then trace each directly.
            try:
                run_client(tpu_master, ",".join(addresses), client_logdir, options, log_path, start_hook)
            except RuntimeError as error:
                if "UNIMPLEMENTED" not in str(error):
                    raise
                run_client(",".join(addresses), "", client_logdir, options, log_path, None)
        else:
            run_client(",".join(addresses), "", client_logdir, options, log_path, start_hook)
    except RuntimeError as error:
        log_text = Path(log_path).read_text(errors="replace") if os.path.exists(log_path) else ""
        raise explain_failure(error, log_text, addresses, options) from None


def where_elsewhere(address: str, logdir: str, tpu_master: Optional[str] = None) -> ElsewhereHost:
    """Where a server on another machine put its trace, and the command that fetches it."""
    from tpuprof.sources.addresses import split_host_port

    profile = "/".join([logdir.rstrip("/"), *PROFILE_DIR])
    if is_remote(logdir):
        return ElsewhereHost(address, profile, f"tpuprof analyze {logdir}")
    host, _ = split_host_port(address)
    # scp takes IPv6 literals in brackets; the run folders of every capture come along (runs never clash).
    remote = f"[{host}]" if ":" in host else host
    return ElsewhereHost(address, f"{remote}:{profile}", f"scp -r '{remote}:{profile}/*' {profile}/")


def _capture_with_other_machines(addresses: list[str], elsewhere: list[str], logdir: str, options: TraceOptions,
                                 tpu_master: Optional[str], on_start: Optional[Callable],
                                 started: float) -> CapturedRun:
    """Servers on other machines write where they run: the run folder of a local LOGDIR on each host's own disk
    (the same absolute path), or a gs:// LOGDIR that every host writes itself. The client is given the logdir
    itself (no scratch folder: a host's scratch would be left on its disk). Files written here (servers on
    this machine) are described; the others are listed with where they are and how to fetch them."""
    scratch = tempfile.mkdtemp(prefix="tpuprof-capture-log-")
    log_path = os.path.join(scratch, "client.log")
    profile = Path(logdir, *PROFILE_DIR)
    try:
        before = set() if is_remote(logdir) or not profile.is_dir() else {p.name for p in profile.iterdir()}
        _trace_all(addresses, logdir, options, tpu_master, log_path, on_start)
        hosts, run_dir, run = [], logdir if is_remote(logdir) else "", ""
        if not is_remote(logdir) and profile.is_dir():
            new = sorted(p for p in profile.iterdir() if p.is_dir() and p.name not in before)
            if new:
                run_dir, run = str(new[-1]), new[-1].name
                hosts = describe_host_files(new[-1])
                for host in hosts:
                    host.path = f"{run_dir}/{host.path}"
        local = [a for a in addresses if a not in elsewhere]
        return CapturedRun(
            run=run, run_dir=run_dir, logdir=logdir, addresses=list(addresses), hosts=hosts,
            attempts_used=max(1, attempts_started(log_path)), seconds=time.monotonic() - started,
            silent=_silent_hosts(local, hosts) if local else [],
            elsewhere=[where_elsewhere(a, logdir, tpu_master) for a in elsewhere])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
