"""Where to capture a profile from: turn what the user typed (or what the platform set) into host:port
addresses of profiler servers, and say which rule picked them.

Order, first match wins: --service-addr, --tpu NAME, TPU_GRPC_URL (Gradient), COLAB_TPU_ADDR (Colab),
TPU_PROCESS_ADDRESSES / TPU_WORKER_HOSTNAMES (TPU VM slices on GKE or by hand), a TPU VM's own
workers from the metadata server, and finally localhost.

Port 8470 in those variables and in TPUClusterResolver's answers is the TPU runtime's gRPC port; the
profiler of a Cloud TPU listens on 8466 (XProf rewrites the port the same way). `--port` overrides the
port for everything derived from a name or the environment; explicit host:port given with
--service-addr is taken as typed.
"""

from __future__ import annotations

import glob
import os
import re
import socket
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

from tpuprof.errors import TF_EXTRA, UserError

PROFILER_PORT = 8466  # the Cloud TPU profiler service; also our default for a local job
TPU_RUNTIME_PORT = 8470  # what TPUClusterResolver / COLAB_TPU_ADDR / TPU_GRPC_URL carry
METADATA_TIMEOUT_S = 2.0


@dataclass
class ProfilerAddresses:
    """The profiler servers a capture reaches, and which rule chose them."""

    addresses: list[str]  # host:port of each profiler server, no scheme
    why: str  # one sentence, without its full stop: which rule chose these addresses
    # A TPU Node name: the node's profiler service can run one session over all workers
    # (XProf's worker_list capture); None for everything else.
    tpu_master: Optional[str] = None
    notes: list[str] = field(default_factory=list)


def split_host_port(text: str) -> tuple[str, Optional[int]]:
    """'grpc://10.0.0.2:8470/' -> ('10.0.0.2', 8470); '[::1]:9012' -> ('::1', 9012); 'host' -> ('host', None)."""
    text = text.strip()
    for scheme in ("grpc://", "http://", "https://", "dns:///"):
        if text.startswith(scheme):
            text = text[len(scheme):]
    text = text.rstrip("/")
    if not text:
        raise UserError("An empty profiler address was given: use host:port, e.g. --service-addr 10.0.0.2:8466.")
    if text.startswith("["):  # IPv6 literal
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    else:
        host, port_text = text, ""
    if not port_text:
        return host, None
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise UserError(f"'{text}' has no valid port: use host:port, e.g. {host or 'localhost'}:{PROFILER_PORT}.")
    return host, int(port_text)


def join_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _profiler_addresses(entries: Sequence[str], port: Optional[int], notes: list[str]) -> list[str]:
    """Addresses from a name/env source: runtime port 8470 -> profiler 8466, --port wins over both."""
    result = []
    for entry in entries:
        host, found = split_host_port(entry)
        if port is not None:
            chosen = port
        elif found in (None, TPU_RUNTIME_PORT):
            chosen = PROFILER_PORT
            if found == TPU_RUNTIME_PORT and not notes:
                notes.append(f"port {TPU_RUNTIME_PORT} is the TPU runtime's; its profiler listens on {PROFILER_PORT}")
        else:
            chosen = found
        result.append(join_host_port(host, chosen))
    return result


def _split_list(text: str) -> list[str]:
    """Addresses separated by commas, semicolons or spaces (no host name or port holds one)."""
    return [part for part in re.split(r"[,;\s]+", text) if part]


def resolve(
    service_addr: Optional[str] = None,
    tpu: Optional[str] = None,
    zone: Optional[str] = None,
    project: Optional[str] = None,
    port: Optional[int] = None,
    environ: Optional[Mapping[str, str]] = None,
) -> ProfilerAddresses:
    """The profiler servers to capture from, and why those."""
    env = os.environ if environ is None else environ
    notes: list[str] = []
    if service_addr:
        addresses = []
        for entry in _split_list(service_addr):
            host, found = split_host_port(entry)
            if found == TPU_RUNTIME_PORT and entry.strip().startswith("grpc://") and port is None:
                found = PROFILER_PORT  # a TPU gRPC URL pasted as is: its profiler is on 8466
                notes = [f"port {TPU_RUNTIME_PORT} is the TPU runtime's; its profiler listens on {PROFILER_PORT}"]
            addresses.append(join_host_port(host, found if found is not None else (port or PROFILER_PORT)))
        return _target(addresses, f"The {_noun(addresses)} given with --service-addr", notes)
    if tpu:
        return resolve_tpu_name(tpu, zone, project, port)
    if env.get("TPU_GRPC_URL"):
        addresses = _profiler_addresses(_split_list(env["TPU_GRPC_URL"]), port, notes)
        return _target(addresses, f"The {_noun(addresses)} taken from TPU_GRPC_URL, which the platform "
                                  "(e.g. Gradient) sets", notes)
    if env.get("COLAB_TPU_ADDR"):
        addresses = _profiler_addresses(_split_list(env["COLAB_TPU_ADDR"]), port, notes)
        return _target(addresses, f"The {_noun(addresses)} taken from COLAB_TPU_ADDR, which the Colab TPU "
                                  "runtime sets", notes)
    for variable in ("TPU_PROCESS_ADDRESSES", "TPU_WORKER_HOSTNAMES"):
        if env.get(variable):
            # Only the hosts count: ports in TPU_PROCESS_ADDRESSES are the runtime's, not the profiler's.
            hosts = [split_host_port(entry)[0] for entry in _split_list(env[variable])]
            addresses = _profiler_addresses(hosts, port, notes)
            return _target(addresses, f"Every worker of this TPU slice is traced; the {_noun(addresses)} taken "
                                      f"from {variable}", notes)
    workers = _tpu_vm_workers()
    if workers and len(workers) > 1:
        addresses = _profiler_addresses(workers, port, notes)
        return _target(addresses, "Every worker of this TPU VM's slice is traced; the addresses "
                                  "were taken from the metadata server", notes)
    chosen = port or PROFILER_PORT
    how = "the port given with --port" if port else f"the default port {PROFILER_PORT}"
    return _target([join_host_port("localhost", chosen)],
                   f"No --tpu, --service-addr or TPU environment variable names a job, so the address is this "
                   f"machine on {how}", notes)


def _noun(addresses: list[str]) -> str:
    return "address was" if len(addresses) == 1 else "addresses were"


# Names of this machine's loopback interface: one profiler server on a port answers to each of them, so two of
# them with one port are one server (its second session found it busy and called it idle).
_LOOPBACK = {"localhost", "127.0.0.1", "::1", "ip6-localhost"}


def _server(address: str) -> str:
    host, port = split_host_port(address)
    return f"loopback:{port}" if host.lower() in _LOOPBACK else address


def _target(addresses: list[str], why: str, notes: list[str], tpu_master: Optional[str] = None) -> ProfilerAddresses:
    servers: dict[str, str] = {}  # the same worker listed twice would be traced twice
    for address in addresses:
        first = servers.setdefault(_server(address), address)
        if first != address:
            notes = notes + [f"{address} is {first}, this machine's loopback: traced once"]
    unique = list(servers.values())
    if not unique:
        raise UserError("No profiler address was found: pass --service-addr host:port or --tpu NAME.")
    return ProfilerAddresses(unique, why, tpu_master, notes)


def _on_tpu_vm() -> bool:
    # The devices libtpu opens on a TPU VM (v4+: /dev/accel*, v5e/v6e also /dev/vfio/N).
    return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


def _metadata(path: str) -> str:
    """A GCE metadata value, with a short timeout so that off Google Cloud we fail fast."""
    endpoint = os.environ.get("GCE_METADATA_HOST") or os.environ.get("GCE_METADATA_IP") or "metadata.google.internal"
    request = urllib.request.Request(f"http://{endpoint}/computeMetadata/v1/{path}",
                                     headers={"Metadata-Flavor": "Google"})
    with urllib.request.urlopen(request, timeout=METADATA_TIMEOUT_S) as response:
        return response.read().decode()


def _tpu_vm_workers() -> list[str]:
    """All workers of this TPU VM's slice, or [] when not on a TPU VM (no network call then)."""
    if not _on_tpu_vm():
        return []
    try:
        text = _metadata("instance/attributes/worker-network-endpoints")
    except (OSError, urllib.error.URLError):
        return []
    # Either plain hostnames or old-style "name:id:ip" triples (the format JAX's cluster code reads).
    hosts = []
    for entry in _split_list(text):
        parts = entry.split(":")
        hosts.append(parts[2] if len(parts) == 3 else parts[0])
    return hosts


def resolve_tpu_name(tpu: str, zone: Optional[str], project: Optional[str], port: Optional[int]) -> ProfilerAddresses:
    """A Cloud TPU name -> its workers' profiler addresses, through TensorFlow's TPUClusterResolver.

    TPUClusterResolver asks the Cloud TPU API (googleapiclient + application-default credentials) and
    the GCE metadata server for the project and zone. We ask the metadata server ourselves first, with
    a timeout, so that off Google Cloud the answer is a clear sentence in 2 s instead of a hang.
    """
    if tpu.startswith("grpc://"):  # TPUClusterResolver takes worker URLs as names too
        target = resolve(service_addr=tpu, port=port)
        target.why = f"The {_noun(target.addresses)} given as a gRPC URL with --tpu"
        return target
    where = []
    if not project or not zone:
        try:
            project = project or _metadata("project/project-id")
            zone = zone or _metadata("instance/zone").rsplit("/", 1)[-1]
        except (OSError, urllib.error.URLError):
            raise UserError(
                f"Cannot resolve TPU '{tpu}': this machine is not on Google Cloud (no metadata server), so the "
                "project and zone are unknown; pass --project and --zone (with credentials from "
                "`gcloud auth application-default login`), or the worker address with --service-addr IP:8466."
            ) from None
    where = f"project {project}, zone {zone}"
    try:
        from tensorflow.python.distribute.cluster_resolver import tpu_cluster_resolver
    except ImportError:
        raise UserError("Resolving a TPU name needs TensorFlow's TPUClusterResolver, which tpuprof installs only when "
                        f"asked ({TF_EXTRA}); or pass the worker address with --service-addr IP:8466.") from None
    try:
        resolver = tpu_cluster_resolver.TPUClusterResolver(tpu=tpu, zone=zone, project=project)
        master = resolver.get_master()
        spec = resolver.cluster_spec().as_dict()
    except Exception as error:  # noqa: BLE001 - googleapiclient/oauth2client/TF raise many kinds
        raise UserError(_tpu_error_sentence(tpu, where, error)) from None
    workers = list(spec.get("worker", [])) or [master]
    notes: list[str] = []
    addresses = _profiler_addresses(workers, port, notes)
    master_address = _profiler_addresses([master], port, [])[0]
    return _target(addresses, f"TPUClusterResolver resolved TPU '{tpu}' ({where}) to {len(addresses)} worker(s)",
                   notes, tpu_master=master_address)


def _tpu_error_sentence(tpu: str, where: str, error: Exception) -> str:
    text = f"{type(error).__name__}: {error}"
    if "Missing runtime dependency" in text or isinstance(error, ImportError):
        return (f"Cannot resolve TPU '{tpu}': TPUClusterResolver needs the Google API client "
                f"({TF_EXTRA}, or google-api-python-client oauth2client); "
                "or pass the worker address with --service-addr IP:8466.")
    if "Credentials" in text or "credentials" in text:
        return (f"Cannot resolve TPU '{tpu}' ({where}): no Google Cloud credentials were found; run "
                "`gcloud auth application-default login` (or set GOOGLE_APPLICATION_CREDENTIALS), "
                "or pass the worker address with --service-addr IP:8466.")
    if "Could not lookup TPU metadata" in text or "404" in text or "not found" in text.lower():
        return (f"No TPU named '{tpu}' was found in {where}: check the name with "
                "`gcloud compute tpus list --zone ZONE` and pass --zone/--project if they differ.")
    if "not yet ready" in text or "not healthy" in text:
        return f"TPU '{tpu}' ({where}) is not ready yet ({error}); capture once it is READY."
    first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return f"Cannot resolve TPU '{tpu}' ({where}): {first_line[:300]}"


def check_reachable(addresses: Sequence[str], attempts: int, wait_s: float = 1.0, why: str = "") -> None:
    """Fail early, with the cause, when a host name does not resolve or nothing listens on the port.

    The profiler client would only say "no trace event was collected"; a plain TCP connect tells DNS
    failures and refused connections apart. Refused connections are retried `attempts` times, `wait_s`
    apart, since a job that is just starting opens its profiler port a little late.
    """
    import time

    pending = list(addresses)
    for attempt in range(max(1, attempts)):
        refused = []
        for address in pending:
            host, port = split_host_port(address)
            try:
                infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except socket.gaierror:
                raise UserError(
                    f"Cannot resolve host '{host}' (DNS lookup failed): check the name, or pass the "
                    "worker's IP with --service-addr IP:PORT."
                ) from None
            if not _connects(infos):
                refused.append(address)
        pending = refused
        if not pending:
            return
        if attempt + 1 < attempts:
            time.sleep(wait_s)
    port = split_host_port(pending[0])[1]
    raise UserError(
        f"Nothing is listening at {', '.join(pending)} (connection refused, {max(1, attempts)} attempt(s)): "
        f"start the profiler server in the training job first - TF: tf.profiler.experimental.server.start({port}); "
        f"JAX: jax.profiler.start_server({port}); PyTorch/XLA: torch_xla.debug.profiler.start_server({port})."
        + (f" {why}." if why else "")
    )


def _connects(infos) -> bool:
    for family, kind, proto, _, sockaddr in infos:
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.settimeout(3.0)
                probe.connect(sockaddr)
                return True
        except OSError:
            continue
    return False
