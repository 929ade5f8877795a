"""Process helpers for the embedded-server and run-command tests."""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from dashboard.embedded import EmbeddedServices


def servers_of(root: Path, name: str | None = None) -> list[psutil.Process]:
    """Live processes whose command line names a path under ``root`` or the socket
    folder of ``root`` (or of ``root/services``, for an instance folder): the postmaster,
    valkey-server (its title names its socket), initdb. Optionally only program ``name``."""
    root = Path(root).resolve()
    paths = {str(root), str(EmbeddedServices(root).socket_dir),
             str(EmbeddedServices(root / "services").socket_dir)}
    found = []
    for proc in psutil.process_iter(["cmdline", "name", "status"]):
        try:
            cmdline = proc.info["cmdline"] or []
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if name and not (proc.info["name"] == name or
                             (cmdline and cmdline[0].endswith(f"/{name}"))):
                continue
            if any(path in part for part in cmdline for path in paths) and \
                    not any(part.endswith(("python", "python3")) for part in cmdline[:1]):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def listening_on(port: int) -> bool:
    return any(c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN
               for c in psutil.net_connections("tcp"))


def wait_until(condition: Callable[[], bool], timeout: float, every: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(every)
    return condition()


def _spin(stop) -> None:
    while not stop.is_set():
        sum(i * i for i in range(10_000))


class CpuLoad:
    """Keeps ``processes`` cores busy for the length of a ``with`` block; ``top_up``: only
    as many as are idle when it starts (in the whole suite, other test workers already
    keep the cores busy, and a spinner there would only slow them)."""

    def __init__(self, processes: int = 2, *, top_up: bool = False) -> None:
        if top_up:
            idle = (os.cpu_count() or 1) * (1 - psutil.cpu_percent(interval=0.5) / 100)
            processes = max(0, min(processes, round(idle)))
        self.processes = processes
        self._stop = multiprocessing.Event()
        self._workers: list[multiprocessing.Process] = []

    def __enter__(self) -> CpuLoad:
        for _ in range(self.processes):
            worker = multiprocessing.Process(target=_spin, args=(self._stop,), daemon=True)
            worker.start()
            self._workers.append(worker)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for worker in self._workers:
            worker.join(timeout=10)
            if worker.is_alive():
                worker.kill()
