"""Process helpers: is a pid alive (and still the same process), what a process runs,
and the kernel's help for process trees (parent-death signals, subreapers). Used by the
embedded servers, the run supervisor and the build worker."""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

import psutil

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
# Loaded once here: a child between fork and exec must not dlopen anything.
_libc = ctypes.CDLL(None, use_errno=True)


def pid_alive(pid: int) -> bool:
    """The process exists and is not a zombie (exited, not yet reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(") ", 1)[1][:1] != "Z"
    except (OSError, IndexError):
        return True


def process_start(pid: int) -> float | None:
    """When the process started (seconds since the epoch), or None if it is gone."""
    try:
        return psutil.Process(pid).create_time()
    except (psutil.Error, OSError):
        return None


def cmdline_names(pid: int, program: bytes, path: bytes) -> bool:
    """The process runs ``program`` and its command line names ``path`` (our data or
    socket folder): a pid from a stale file may now be someone else's server."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return program in cmdline.split(b"\0", 1)[0] and path in cmdline


def read_pid(path: Path) -> int | None:
    """The number in a pid file, or None if it is missing or not a number."""
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def wait_for(ready: Callable[[], bool], timeout: float) -> bool:
    """Poll ``ready`` every 0.1 s until it is true (True) or ``timeout`` passed (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return True
        time.sleep(0.1)
    return False


def die_with_parent(parent: int, sig: int = signal.SIGTERM) -> None:
    """For ``preexec_fn``: ask the kernel to send ``sig`` when the parent dies."""
    _libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def become_subreaper() -> None:
    """Orphaned descendants (a work horse whose worker died) are re-parented to this
    process rather than to init, so it can still find and stop them."""
    _libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _terminated(signum: int, frame: Any) -> None:  # noqa: ARG001
    raise SystemExit(128 + signum)


def exit_cleanly_on_sigterm() -> None:
    """Make SIGTERM raise SystemExit, so atexit hooks still run, unless the process
    already installed a SIGTERM handler of its own (RQ and gunicorn do, and theirs exit
    through atexit too). Only the main thread can set handlers; elsewhere a no-op."""
    # SIGTERM's default action ends the process without its atexit hooks: a holder told
    # to stop while still setting up would leave the servers running for nobody.
    if threading.current_thread() is not threading.main_thread():
        return
    with suppress(ValueError, OSError):
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _terminated)
