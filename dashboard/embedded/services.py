"""``EmbeddedServices``: PostgreSQL and Valkey under one folder, shared by every process
that uses them. The first holder starts them, the last live one stops them, and a guard
process stops them when no live holder is left. ``get_services`` gives one per folder."""

from __future__ import annotations

import atexit
import hashlib
import os
import pwd
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dashboard.embedded.errors import EmbeddedError
from dashboard.embedded.holders import Holder, HoldersFile, read_holder, write_holder
from dashboard.embedded.postgres import (
    APP_ROLE,
    POSTGRES_PORT,
    SUPERUSER,
    Postgres,
    postgres_system_user,
)
from dashboard.embedded.processes import exit_cleanly_on_sigterm, process_start
from dashboard.embedded.valkey import Valkey

# sun_path is 108 bytes with its NUL; PostgreSQL also needs room for ".lock".
_SOCKET_PATH_MAX = 100


@dataclass(frozen=True)
class EmbeddedUrls:
    socket_dir: str
    redis: str

    def database_url(self, name: str, role: str = APP_ROLE) -> str:
        return f"postgresql+psycopg://{role}@/{name}?host={self.socket_dir}"

    @property
    def postgres_admin(self) -> str:
        """The superuser on the maintenance database (CREATE DATABASE, roles, extensions)."""
        return f"postgresql://{SUPERUSER}@/postgres?host={self.socket_dir}"


class EmbeddedServices:
    # How long a server that runs but does not answer yet (starting, loading its data, a
    # loaded machine) gets before it is stopped and started again.
    answer_grace: float = 120.0

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root).resolve()
        self.pgdata = self.root / "pgdata"
        self.valkey_dir = self.root / "valkey"
        self.socket_dir = socket_dir_for(self.root)
        self.valkey_socket = self.socket_dir / "valkey.sock"
        self.postgres = Postgres(self.root, self.socket_dir)
        self.valkey = Valkey(self.valkey_dir, self.valkey_socket)
        self._holders = HoldersFile(self.root)
        self._guard_file = self.root / "guard.json"
        self._registered_pid: int | None = None

    def urls(self) -> EmbeddedUrls:
        """How to reach the servers; computing it starts nothing."""
        return EmbeddedUrls(socket_dir=str(self.socket_dir), redis=f"unix://{self.valkey_socket}")

    def holders(self) -> list[int]:
        """Pids of the live processes holding the servers (dead ones pruned)."""
        with self._holders.locked():
            live = self._holders.read()
            if self._holders.exists():
                self._holders.write(live)
            return [h.pid for h in live]

    # -- lifecycle ------------------------------------------------------------
    def ensure(self, *, hold: bool = True, postgres: bool = True,
               redis: bool = True) -> EmbeddedUrls:
        """Start the servers asked for unless they answer already; return how to reach
        them. If one cannot be started, what this call started is stopped again (unless
        another live process holds the servers) and EmbeddedError says why."""
        with self._holders.locked():
            others = self._holders.others()
            started: list[str] = []
            try:
                self._prepare_socket_dir()
                if postgres and self._ensure_postgres():
                    started.append("postgres")
                if redis and self._ensure_valkey():
                    started.append("valkey")
            except BaseException:
                if started and not others:
                    with suppress(Exception):
                        self._stop_all(only=started)
                raise
            if hold and self._registered_pid != os.getpid():
                self._holders.write([*others, Holder.me()])
                self._registered_pid = os.getpid()
                atexit.register(self.release)
                exit_cleanly_on_sigterm()
            if hold and self.server_pids() and self._guard() is None:
                self._start_guard()
        return self.urls()

    # One method per server, so a test can make one of them fail.
    def _ensure_postgres(self) -> bool:
        return self.postgres.ensure(self.answer_grace)

    def _ensure_valkey(self) -> bool:
        return self.valkey.ensure(self.answer_grace)

    def release(self) -> None:
        """Drop this process's hold; the last live holder stops the servers."""
        # Forked children (RQ work horses, gunicorn workers) inherit atexit hooks.
        if self._registered_pid != os.getpid():
            return
        self._registered_pid = None
        with suppress(Exception):
            atexit.unregister(self.release)
        with self._holders.locked():
            remaining = self._holders.others()
            self._holders.write(remaining)
            if not remaining:
                self._stop_all()

    def stop(self, *, force: bool = False) -> list[int]:
        """Stop both servers. Refused (returns the live holders) while other processes
        hold them, unless ``force``."""
        with self._holders.locked():
            others = [h.pid for h in self._holders.others()]
            if others and not force:
                return others
            self._holders.write([])
            self._registered_pid = None
            self._stop_all()
        return []

    def status(self) -> dict[str, Any]:
        """What runs, by asking the servers themselves. Starts nothing."""
        return {
            "postgres": self.postgres.state(),
            "valkey": self.valkey.state(),
            "holders": self.holders(),
            "root": str(self.root),
            "sockets": str(self.socket_dir),
        }

    def server_pids(self) -> set[int]:
        """The postmaster's and valkey-server's pids, where they run."""
        return {pid for pid in (self.postgres.postmaster_pid(), self.valkey.pid()) if pid}

    def own_pids(self) -> set[int]:
        """The servers' pids and their guard's."""
        guard = self.guard_pid()
        return self.server_pids() | ({guard} if guard else set())

    @contextmanager
    def settled(self) -> Iterator[set[int]]:
        """``own_pids`` held still: inside, no process starts or stops a server (the
        folder's lock), so a server still starting is never taken for something else."""
        with self._holders.locked():
            yield self.own_pids()

    # -- the guard --------------------------------------------------------------
    # Not every holder gets to release at exit (a supervisor killed with -9 before its
    # children touched a server): the guard, a process of its own session, stops the
    # servers once no live holder is left.
    def _guard(self) -> Holder | None:
        return read_holder(self._guard_file)

    def guard_pid(self) -> int | None:
        guard = self._guard()
        return guard.pid if guard else None

    def _start_guard(self) -> None:
        process = subprocess.Popen(
            [sys.executable, "-m", "dashboard.embedded.guard", str(self.root)],
            start_new_session=True, close_fds=True, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # Kept (Popen warns when collected while its process runs); the ones that ended
        # are reaped here, so a long-lived starter collects no zombies.
        _guards[:] = [guard for guard in _guards if guard.poll() is None]
        _guards.append(process)
        write_holder(self._guard_file, Holder(process.pid, process_start(process.pid)))

    def guard(self, every: float = 1.0) -> None:
        """The guard's loop: returns once the servers are stopped (by it, when no live
        holder is left, or by anyone else)."""
        while True:
            time.sleep(every)
            with self._holders.locked():
                current = self._guard()
                if current is not None and current.pid != os.getpid():
                    return  # replaced (this one was thought dead): one guard is enough
                if self.server_pids() and self._holders.read():
                    continue
                if self.server_pids():
                    self._holders.write([])
                    self._stop_all()
                # Leaving: an ensure from now on starts a new guard rather than count on
                # this one (still alive for a moment after it let go of the lock).
                with suppress(FileNotFoundError):
                    self._guard_file.unlink()
                return

    # -- both servers -------------------------------------------------------------
    def _prepare_socket_dir(self) -> None:
        """Make the socket folder ours (0700), refusing one someone else made: under the
        temp folder its name can be guessed, and a planted folder or symlink must never
        receive our sockets or a chmod."""
        user = postgres_system_user()
        expected = {os.geteuid()}
        if user:  # PostgreSQL runs as that user and creates its socket here
            entry = pwd.getpwnam(user)
            expected.add(entry.pw_uid)
        with suppress(FileExistsError):
            self.socket_dir.mkdir(mode=0o700, parents=True)
        info = os.lstat(self.socket_dir)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid not in expected:
            raise EmbeddedError(
                f"The socket folder {self.socket_dir} exists but was not made by this set-up "
                "(wrong owner, or not a folder). Remove it, or set ORBITPILOT_EMBEDDED_DIR "
                "to a shorter path.")
        os.chmod(self.socket_dir, 0o700, follow_symlinks=False)
        if user:
            os.chown(self.socket_dir, entry.pw_uid, entry.pw_gid, follow_symlinks=False)

    def _stop_all(self, only: list[str] | None = None) -> None:
        try:
            if only is None or "valkey" in only:
                self.valkey.stop()
        finally:
            if only is None or "postgres" in only:
                self.postgres.stop()
            if self.root not in self.socket_dir.parents:
                # A folder of ours under the temp folder: gone with the servers (it stays
                # while either still has its socket in it).
                with suppress(OSError):
                    self.socket_dir.rmdir()


def socket_dir_for(root: Path) -> Path:
    """``<root>/run`` when its socket paths fit the OS limit; otherwise a short folder
    of its own under the temp folder, named after ``root`` (stable across runs)."""
    local = root / "run"
    if len(os.fsencode(local / f".s.PGSQL.{POSTGRES_PORT}.lock")) <= _SOCKET_PATH_MAX:
        return local
    digest = hashlib.sha256(os.fsencode(root)).hexdigest()[:16]
    base = Path(tempfile.gettempdir())
    if len(os.fsencode(base)) > 40:
        base = Path("/tmp")
    return base / f"orbitpilot-{digest}"


_services: dict[Path, EmbeddedServices] = {}
_guards: list[subprocess.Popen] = []


def get_services(root: Path | str) -> EmbeddedServices:
    """The one ``EmbeddedServices`` of this process for folder ``root``."""
    key = Path(root).resolve()
    if key not in _services:
        _services[key] = EmbeddedServices(key)
    return _services[key]
