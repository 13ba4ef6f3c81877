"""Tasks on a Ray cluster, for the commands that scale out (analyze's hosts, preflight's sweeps): connecting, the
one-sentence answers when the cluster cannot be reached, and the results in the order asked."""

from __future__ import annotations

import os
import re

from tpuprof.errors import UserError

RAY_ADDRESS_ENV = "TPUPROF_RAY_ADDRESS"


def ray_address(option: str | None) -> str | None:
    """--ray, else $TPUPROF_RAY_ADDRESS, else None (local processes)."""
    return option or os.environ.get(RAY_ADDRESS_ENV) or None


def map_on_ray(function, items: list, address: str) -> list:
    """FUNCTION of each item as a Ray task (one CPU each), results in the items' order; a task's UserError is the
    same sentence here."""
    try:
        import ray
    except ImportError:
        raise UserError("--ray needs Ray installed here and on the cluster: pip install 'tpuprof[ray]'.") from None
    import logging

    connected_here = not ray.is_initialized()
    if connected_here:
        _check_listening(address)
        _check_where_ray_connects(address)
        try:
            ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
        except (ConnectionError, ValueError, RuntimeError) as error:
            raise UserError(_unreachable(address, error)) from None
    try:
        task = ray.remote(num_cpus=1, max_retries=0)(function)
        refs = [task.remote(item) for item in items]
        try:
            return ray.get(refs)
        except ray.exceptions.RayTaskError as error:
            cause = getattr(error, "cause", None)
            if isinstance(cause, UserError):
                raise UserError(str(cause)) from None
            raise UserError(f"a Ray task failed: {str(cause or error).splitlines()[0][:300]}.") from None
    finally:
        if connected_here:
            ray.shutdown()


# Ray's single-machine switch: a cluster started with it set to 0 listens on loopback only, and a driver without it
# turns 127.0.0.1 into this machine's own address, where nothing listens (it retries for about two minutes).
RAY_LOOPBACK_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def _check_listening(address: str) -> None:
    """A HOST:PORT where nothing accepts connections is said at once: Ray itself retries for 20 s to 2 min."""
    import socket

    host, _, port = address.removeprefix("ray://").rpartition(":")  # the Ray client's port (10001) alike
    if address in ("auto", "local") or "://" in host or not port.isdigit() or not host:
        return  # Ray finds these itself (RAY_ADDRESS, the local cluster)
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except OSError as error:
        why = error.strerror or type(error).__name__
        raise UserError(f"cannot reach the Ray cluster at {address}: nothing accepts connections there "
                        f"({why.lower()}); is the cluster up (`ray status` on its head node)?") from None


def _check_where_ray_connects(address: str) -> None:
    """Ray connects a driver to a loopback address through this machine's own address unless
    RAY_LOOPBACK_ONLY_ENV is set (ray._private.services.canonicalize_bootstrap_address): a cluster on loopback only
    is then unreachable, and Ray retries for 35 s to 2 min before it says so. Said at once instead."""
    import socket

    if address.startswith("ray://") or address in ("auto", "local"):  # the Ray client connects where it is told
        return
    try:
        from ray._private.services import canonicalize_bootstrap_address

        canonical = canonicalize_bootstrap_address(address)
    except Exception:  # noqa: BLE001 - a private helper that moved, or an address Ray refuses: ray.init says
        return
    if not canonical or canonical == address:
        return
    host, _, port = canonical.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except (OSError, ValueError):
        raise UserError(_unreachable(address, ConnectionError(
            f"Ray connects to {canonical} instead, where nothing accepts connections"))) from None


def _unreachable(address: str, error: BaseException) -> str:
    """Ray's own sentence and the reason under it (an authentication token missing, nothing listening), without
    the traceback text Ray embeds in it; for a loopback address, the setting that makes Ray use loopback."""
    why = []
    for e in (error, error.__cause__):
        head, _, traceback = str(e or "").partition("Traceback (most recent call last)")
        head = (head.strip().splitlines() or [""])[0].removesuffix("Last connection error:").strip(" .:")
        # The traceback's last line is the error itself (ray.exceptions.AuthenticationError: ... token is missing).
        last = ([line for line in traceback.splitlines() if line.strip()] or [""])[-1].strip()
        last = re.sub(r"^[\w.]+\.(\w+(Error|Exception)):", r"\1:", last).split(". ")[0].strip(" .")
        for text in (head, last):
            if text and text not in why:
                why.append(text[:200])
    sentence = f"cannot reach the Ray cluster at {address}: {'; '.join(why) or type(error).__name__}"
    host = address.removeprefix("ray://").rsplit(":", 1)[0].strip("[]")
    if host in ("127.0.0.1", "localhost", "::1") and RAY_LOOPBACK_ONLY_ENV not in os.environ:
        sentence += (f" (Ray connects to a loopback address through this machine's own: a cluster started with "
                     f"{RAY_LOOPBACK_ONLY_ENV}=0 listens on loopback only and needs it set here too)")
    elif "AuthenticationError" in sentence:
        sentence += " (the cluster's token goes in ~/.ray/auth_token, RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN)"
    return sentence + "."
