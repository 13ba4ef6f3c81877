"""Time limits on remote file systems (gs:// and any other fsspec URL).

gcsfs retries a host that does not answer for most of a minute, and asks the metadata server for credentials
first; meanwhile the command said nothing. Every remote call goes through `call`: after WAIT_NOTICE_S it says on
stderr that it is waiting, and after LIMIT_S it gives up with one sentence. The call runs in a daemon thread, so
the command can stop while the library is still stuck in its retries.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Callable, TypeVar

from tpuprof.errors import UserError

T = TypeVar("T")
WAIT_NOTICE_S = 3.0
LIMIT_S = float(os.environ.get("TPUPROF_REMOTE_TIMEOUT_S", "30"))
_said_waiting: set[str] = set()


def is_remote(path: str) -> bool:
    return "://" in str(path) and not str(path).startswith("file://")


def _where(url: str) -> str:
    """`gs://bucket/a/b` -> `gs://bucket`: what is not answering."""
    protocol, _, rest = str(url).partition("://")
    return f"{protocol}://{rest.split('/', 1)[0]}"


def call(url: str, doing: str, function: Callable[..., T], *args, **kwargs) -> T:
    """FUNCTION(*ARGS, **KWARGS), a file-system call about URL, within LIMIT_S (DOING says what it was, for the
    error: 'listing the capture', 'reading', 'uploading')."""
    result: dict = {}

    def run() -> None:
        try:
            result["value"] = function(*args, **kwargs)
        except BaseException as error:  # noqa: BLE001 - handed to the caller's thread as it is
            result["error"] = error

    worker = threading.Thread(target=run, daemon=True, name=f"tpuprof-remote {doing}")
    worker.start()
    worker.join(min(WAIT_NOTICE_S, LIMIT_S))
    if worker.is_alive():
        where = _where(url)
        if where not in _said_waiting:
            _said_waiting.add(where)
            print(f"tpuprof: waiting for {where} to answer ({doing}; giving up after {LIMIT_S:.0f} s)...",
                  file=sys.stderr, flush=True)
        worker.join(max(LIMIT_S - WAIT_NOTICE_S, 0))
    if worker.is_alive():
        raise UserError(f"no answer from {_where(url)} within {LIMIT_S:.0f} s while {doing}: check the network, "
                        "the address and the credentials.")
    if "error" in result:
        raise result["error"]
    return result["value"]


def quiet_loggers() -> None:
    """gcsfs and friends log their retries with tracebacks; our one-line error says what failed."""
    import logging

    for name in ("gcsfs", "fsspec", "google", "google.auth", "aiohttp", "s3fs", "adlfs"):
        logger = logging.getLogger(name)
        if not any(isinstance(h, logging.NullHandler) for h in logger.handlers):
            logger.addHandler(logging.NullHandler())
        logger.propagate = False
