"""Who holds the embedded servers: ``holders.json`` lists the live processes using them,
changed only under the folder's file lock (``services.lock``). The guard's own record
(``guard.json``) is a holder record too."""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from dashboard.embedded.processes import pid_alive, process_start


@dataclass(frozen=True)
class Holder:
    """A process holding the servers. Its start time guards against a reused pid: a new
    process with an old holder's pid is not that holder."""

    pid: int
    started: float | None

    @classmethod
    def me(cls) -> Holder:
        return cls(os.getpid(), process_start(os.getpid()))

    def alive(self) -> bool:
        if not pid_alive(self.pid):
            return False
        started = process_start(self.pid)
        return self.started is None or started is None or abs(started - self.started) < 1.0


class HoldersFile:
    """``holders.json`` under ``root``, and the lock every start and stop is made under."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.path = root / "holders.json"

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the folder's lock (one process at a time, across processes)."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / "services.lock", "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def exists(self) -> bool:
        return self.path.exists()

    def read(self) -> list[Holder]:
        """The live holders listed (dead ones left out)."""
        try:
            entries = json.loads(self.path.read_text() or "[]")
        except (FileNotFoundError, ValueError):
            return []
        holders = []
        for entry in entries:
            if isinstance(entry, list) and len(entry) == 2:
                holder = Holder(int(entry[0]), float(entry[1]))
            elif isinstance(entry, int):  # the older layout: a bare pid
                holder = Holder(entry, None)
            else:
                continue
            if holder.alive():
                holders.append(holder)
        return holders

    def write(self, holders: list[Holder]) -> None:
        # Written whole then renamed: a reader never sees half a file.
        unique = {h.pid: h for h in holders}
        tmp = self.path.with_name(f".holders.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(sorted([h.pid, h.started] for h in unique.values())))
        tmp.replace(self.path)

    def others(self) -> list[Holder]:
        """The live holders other than this process."""
        return [h for h in self.read() if h.pid != os.getpid()]


def read_holder(path: Path) -> Holder | None:
    """The holder recorded alone in ``path``, if that process still lives."""
    try:
        pid, started = json.loads(path.read_text())
        holder = Holder(int(pid), float(started))
    except (OSError, ValueError, TypeError):
        return None
    return holder if holder.alive() else None


def write_holder(path: Path, holder: Holder) -> None:
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps([holder.pid, holder.started]))
    tmp.replace(path)
