"""The run command as a person uses it: it serves, Ctrl+C ends all of it within
seconds, and a run killed at any moment leaves nothing the next run cannot recover from.
Each run gets a fresh instance folder (a fresh clone's first run) and a port of its own."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tests.embedded.procs import listening_on, servers_of, wait_until

pytestmark = pytest.mark.processes  # real processes or servers: slow

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serves(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/auth/signin", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


class Run:
    def __init__(self, instance: Path) -> None:
        self.instance, self.port = instance, free_port()
        env = {k: v for k, v in os.environ.items()
               if k not in ("DATABASE_URL", "REDIS_URL", "DATABASE_OWNER_URL")}
        env.update(ORBITPILOT_INSTANCE=str(instance), PORT=str(self.port), WEB_WORKERS="1",
                   BUILD_QUEUE=f"builds-run-{self.port}")
        self.log = instance.with_suffix(".log")
        instance.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen([str(ROOT / "scripts" / "run")], cwd=ROOT, env=env,
                                     stdout=self.log.open("w"), stderr=subprocess.STDOUT,
                                     start_new_session=True)  # its own group, like a shell job

    def output(self) -> str:
        return self.log.read_text()

    def wait_serving(self, timeout: float = 180) -> None:
        assert wait_until(lambda: serves(self.port) or self.proc.poll() is not None,
                          timeout=timeout, every=0.2), self.output()[-3000:]
        assert self.proc.poll() is None, self.output()[-3000:]

    def signal_group(self, sig: int) -> None:
        os.killpg(self.proc.pid, sig)

    def left_behind(self) -> list:
        return servers_of(self.instance)

    def kill_everything(self) -> None:
        for proc in self.left_behind():
            proc.kill()
        if self.proc.poll() is None:
            self.proc.kill()


@pytest.fixture
def runs(tmp_path):
    started: list[Run] = []

    def start(name: str = "instance") -> Run:
        run = Run(tmp_path / name)
        started.append(run)
        return run

    yield start
    for run in started:
        run.kill_everything()


def test_ctrl_c_right_after_it_serves_ends_everything_within_15_seconds(runs):
    run = runs()
    run.wait_serving()
    assert "Demo accounts" in run.output()
    assert run.left_behind(), "the embedded servers should be up while it serves"
    sent = time.monotonic()
    run.signal_group(signal.SIGINT)  # what the terminal does on Ctrl+C
    run.proc.wait(timeout=15)
    assert time.monotonic() - sent < 15
    assert run.left_behind() == []  # no PostgreSQL, no Valkey
    assert not listening_on(run.port)  # no web server
    assert "==> stopped" in run.output()


def test_a_run_killed_in_its_first_seconds_never_spoils_the_next(runs, tmp_path):
    for delay in (0.5, 1.0, 2.5):
        run = runs("clone")
        time.sleep(delay)
        run.signal_group(signal.SIGKILL)
        run.proc.wait(timeout=10)
        # Servers a killed run left are found and reused (or stopped) by the next.
    run = runs("clone")
    run.wait_serving()
    run.signal_group(signal.SIGINT)
    run.proc.wait(timeout=15)
    assert wait_until(lambda: run.left_behind() == [], timeout=15)


def test_kill_9_of_the_run_command_takes_its_web_server_and_worker_down(runs):
    run = runs()
    run.wait_serving()
    os.kill(run.proc.pid, signal.SIGKILL)  # only the supervising process
    run.proc.wait(timeout=10)
    # Its children were told by the kernel; the last of them stops the servers.
    assert wait_until(lambda: not listening_on(run.port), timeout=20)
    assert wait_until(lambda: run.left_behind() == [], timeout=30), \
        [p.cmdline() for p in run.left_behind()]
    again = runs()
    again.wait_serving()
    again.signal_group(signal.SIGTERM)
    again.proc.wait(timeout=15)


def test_kill_9_of_the_run_command_while_its_worker_sets_up_leaves_nothing_running(runs):
    # The only holder of the servers is then the killed process itself: the worker has
    # not touched them yet, the web server has served nothing. Their guard stops them.
    run = runs()
    assert wait_until(lambda: "==> web on" in run.output() or run.proc.poll() is not None,
                      timeout=180, every=0.05), run.output()[-3000:]
    time.sleep(1.0)
    os.kill(run.proc.pid, signal.SIGKILL)
    run.proc.wait(timeout=10)
    assert wait_until(lambda: run.left_behind() == [], timeout=30), \
        [p.cmdline() for p in run.left_behind()]
