"""The run command as a person uses it: it serves, Ctrl+C ends all of it within
seconds, and a run killed at any moment leaves nothing the next run cannot recover from.
Each run gets a fresh instance folder (a fresh clone's first run) and a port of its own."""

from __future__ import annotations

import http.cookiejar
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import psutil
import psycopg
import pytest
from redis import Redis
from rq import Worker

from dashboard.embedded import EmbeddedServices
from dashboard.saved_memories import NO_MATCH
from tests.embedded.procs import listening_on, servers_of, wait_until
from tests.factories import GATE_VARIABLE

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
    def __init__(self, instance: Path, env: dict[str, str] | None = None,
                 command: list[str] | None = None) -> None:
        self.instance, self.port = instance, free_port()
        self.services = EmbeddedServices(instance / "services")  # its paths; starts nothing
        env = {**{k: v for k, v in os.environ.items()
                  if k not in ("DATABASE_URL", "REDIS_URL", "DATABASE_OWNER_URL")}, **(env or {})}
        # A value of None: the variable unset, as on a machine where nobody set it.
        env = {k: v for k, v in env.items() if v is not None}
        env.update(ORBITPILOT_INSTANCE=str(instance), PORT=str(self.port), WEB_WORKERS="1",
                   BUILD_QUEUE=f"builds-run-{self.port}")
        self.log = instance.with_suffix(".log")
        instance.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(command or [str(ROOT / "scripts" / "run")], cwd=ROOT,
                                     env=env, stdout=self.log.open("w"),
                                     stderr=subprocess.STDOUT,
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

    def child(self, word: str) -> psutil.Process | None:
        """The supervisor's child whose command line has ``word`` ("worker", "gunicorn")."""
        with _gone_is_none():
            for proc in psutil.Process(self.proc.pid).children():
                with _gone_is_none():  # a zombie, or gone meanwhile
                    if word in proc.cmdline() and proc.status() != psutil.STATUS_ZOMBIE:
                        return proc
        return None

    def rows(self, query: str, *args) -> list[tuple]:
        """Rows of the run's own database, read as the superuser (it holds nothing)."""
        dsn = f"host={self.services.socket_dir} user=postgres dbname=orbitpilot"
        with psycopg.connect(dsn, connect_timeout=5) as conn:
            return conn.execute(query, args).fetchall()

    def redis(self) -> Redis:
        return Redis(unix_socket_path=str(self.services.valkey_socket), socket_timeout=2,
                     socket_connect_timeout=2)

    def registered_workers(self) -> set[int]:
        """Pids of the RQ workers registered in the run's Valkey (up and listening)."""
        with _gone_is_none(), self.redis() as redis:
            return {w.pid for w in Worker.all(connection=redis)}
        return set()

    def running_build(self) -> tuple[int, int] | None:
        with _gone_is_none():
            found = self.rows("SELECT id, user_id FROM memory_builds WHERE status = 'running'")
            return found[0] if found else None
        return None

    def builds_of(self, user_id: int) -> list[tuple]:
        return self.rows("SELECT id, status, error FROM memory_builds WHERE user_id = %s "
                         "ORDER BY id", user_id)

    def built(self, user_id: int) -> bool:
        """Every request of the user has run, the last one well, and its chunks are in."""
        with _gone_is_none():
            builds = self.builds_of(user_id)
            chunks = self.rows("SELECT count(*) FROM memory_chunks WHERE user_id = %s",
                               user_id)[0][0]
            return bool(builds) and builds[-1][1] == "succeeded" and chunks > 0
        return False


class _gone_is_none:
    """A process, database or Valkey that is gone for a moment reads as "not yet"."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, value, tb) -> bool:
        return kind is not None and issubclass(kind, (psutil.Error, psycopg.Error, OSError,
                                                      ConnectionError, TimeoutError)) or \
            (kind is not None and kind.__module__.startswith("redis"))


class Pages:
    """Asks for a page every 0.1 s for the length of a ``with`` block; ``failures`` lists
    every answer that was not a 200 (or no answer at all)."""

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}/auth/signin"
        self.answered, self.failures = 0, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.wait(0.1):
            try:
                with urllib.request.urlopen(self.url, timeout=10) as response:
                    status = response.status
            except OSError as exc:
                status = type(exc).__name__
            if status == 200:
                self.answered += 1
            else:
                self.failures.append(status)

    def __enter__(self) -> Pages:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=15)


def held_builds(gate: Path) -> dict[str, str]:
    """The run's builds wait, "running", until ``gate`` exists; a build whose worker died
    is noticed within seconds, and lost jobs are pushed again at once."""
    return {"EMBEDDER": "tests.factories:GatedEmbedder", GATE_VARIABLE: str(gate),
            "BUILD_HEARTBEAT_SECONDS": "0.2", "BUILD_STALE_SECONDS": "2",
            "BUILD_SWEEP_SECONDS": "1", "BUILD_REQUEUE_SECONDS": "1"}


def serving_with_a_held_build(runs, gate: Path):
    """A run that serves, with one build held running; the run and (build id, user id)."""
    run = runs(env=held_builds(gate))
    run.wait_serving()
    assert wait_until(lambda: run.running_build() is not None, timeout=60), run.output()[-3000:]
    return run, run.running_build()


def running(proc: psutil.Process) -> bool:
    with _gone_is_none():
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    return False


@pytest.fixture
def runs(tmp_path):
    started: list[Run] = []

    def start(name: str = "instance", **options) -> Run:
        run = Run(tmp_path / name, **options)
        started.append(run)
        return run

    yield start
    for run in started:
        run.kill_everything()


def test_a_run_killed_early_never_spoils_the_next_and_ctrl_c_ends_that_one(runs, tmp_path):
    for delay in (0.5, 1.0, 2.5):
        run = runs("clone")
        time.sleep(delay)
        run.signal_group(signal.SIGKILL)
        run.proc.wait(timeout=10)
        # Servers a killed run left are found and reused (or stopped) by the next.
    # Only the supervisor killed, while its worker sets up: the only holder of the
    # servers is then the killed process itself (the worker has not touched them yet,
    # the web server has served nothing). Their guard stops them.
    run = runs("clone")
    assert wait_until(lambda: "==> web on" in run.output() or run.proc.poll() is not None,
                      timeout=180, every=0.05), run.output()[-3000:]
    time.sleep(1.0)
    os.kill(run.proc.pid, signal.SIGKILL)
    run.proc.wait(timeout=10)
    assert wait_until(lambda: run.left_behind() == [], timeout=30), \
        [p.cmdline() for p in run.left_behind()]
    # The next run serves; Ctrl+C right after it serves ends all of it within 15 s.
    run = runs("clone")
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


def test_a_worker_killed_during_a_build_is_started_again_and_the_build_asked_again(
        runs, tmp_path):
    gate = tmp_path / "gate"
    run, (build_id, user_id) = serving_with_a_held_build(runs, gate)
    worker = run.child("worker")
    horses = worker.children()
    assert horses, "the build runs in no work horse"
    with Pages(run.port) as pages:
        worker.kill()  # SIGKILL
        assert wait_until(lambda: run.registered_workers() - {worker.pid}, timeout=10), \
            run.output()[-3000:]  # a new worker is up within 10 s
        assert not any(running(p) for p in horses)  # the dead worker's horse is stopped
        assert wait_until(lambda: run.builds_of(user_id)[0][1] == "failed", timeout=60)
        killed = run.builds_of(user_id)[0]
        assert killed[0] == build_id and killed[2], killed  # failed, with a reason
        gate.touch()
        # Its request ran again: the user's chunks are built.
        assert wait_until(lambda: run.built(user_id), timeout=60), run.builds_of(user_id)
        assert wait_until(lambda: pages.answered > 10, timeout=30)
    assert pages.failures == [] and pages.answered > 10, pages.failures
    assert run.proc.poll() is None, run.output()[-3000:]
    assert "worker was killed by SIGKILL" in run.output()

    # A web server that dies is started again too, once its orphaned workers are stopped
    # (they hold the port).
    web = run.child("gunicorn")
    orphans = web.children()
    web.kill()
    assert wait_until(lambda: "web server started again" in run.output() and serves(run.port),
                      timeout=60), run.output()[-3000:]
    assert not any(running(p) for p in orphans)
    assert "web server was killed by SIGKILL" in run.output()
    run.signal_group(signal.SIGINT)
    assert run.proc.wait(timeout=15) == 0
    assert run.left_behind() == []


def test_a_valkey_killed_during_a_build_is_started_again_and_the_worker_builds_on(
        runs, tmp_path):
    gate = tmp_path / "gate"
    run, (build_id, user_id) = serving_with_a_held_build(runs, gate)
    worker = run.child("worker")
    (valkey,) = servers_of(run.services.root, "valkey-server")
    with Pages(run.port) as pages:
        valkey.kill()  # SIGKILL
        assert wait_until(lambda: run.services.valkey.answers() and
                          run.services.valkey.pid() not in (None, valkey.pid), timeout=30), \
            run.output()[-3000:]
        gate.touch()
        users = [u for (u,) in run.rows("SELECT id FROM users")]
        # The build the outage caught, and the requests whose jobs Valkey lost, all run.
        assert wait_until(lambda: all(run.built(u) for u in users), timeout=90), \
            [run.builds_of(u) for u in users]
        # The builds may be done within a second (a batch): pages go on being asked.
        assert wait_until(lambda: pages.answered > 10, timeout=30)
    assert pages.failures == [] and pages.answered > 10, pages.failures
    assert run.proc.poll() is None, run.output()[-3000:]
    assert running(worker) and run.child("worker").pid == worker.pid  # it lived through it
    first = run.builds_of(user_id)[0]
    assert first[0] == build_id and (first[1] == "succeeded" or first[2]), first
    run.signal_group(signal.SIGINT)
    assert run.proc.wait(timeout=15) == 0
    assert run.left_behind() == []


def test_a_worker_that_keeps_dying_ends_the_run_and_says_so(runs):
    # Shorter delays than the real ones (1 s, doubling) and a smaller window than 5
    # restarts (each start of a worker costs seconds): the same policy, sooner.
    command = [sys.executable, "-c", textwrap.dedent("""
        import dashboard.supervisor as supervisor
        supervisor.FIRST_RESTART_DELAY = 0.1
        supervisor.RESTARTS_PER_WINDOW = 2
        raise SystemExit(supervisor.main())
    """)]
    # A worker that cannot load its app (its FLASK_APP names no module) dies at once.
    run = runs(env={"FLASK_APP": "tests.no_such_app"}, command=command)
    assert run.proc.wait(timeout=180) == 1, run.output()[-3000:]
    output = run.output()
    assert output.count("worker exited with status 2; starting it again") == 2, output[-3000:]
    assert "restarts keep failing" in output
    assert "==> stopped" in output
    assert run.left_behind() == [] and not listening_on(run.port)


class Browser:
    """A person at the run's pages: a cookie jar, and the CSRF token of each form."""

    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))

    def get(self, path: str) -> str:
        with self.opener.open(self.base + path, timeout=60) as response:
            return response.read().decode()

    def post_form(self, path: str, fields: list[tuple[str, str]]) -> str:
        token = re.search(r'name="csrf_token"[^>]*value="([^"]+)"', self.get(path)).group(1)
        data = urllib.parse.urlencode([("csrf_token", token), *fields]).encode()
        with self.opener.open(self.base + path, data=data, timeout=60) as response:
            return response.read().decode()


def web_workers_hold_the_model(run: Run) -> bool:
    """Every web worker has MiniLM's weights mapped (loaded, not merely importable)."""
    with _gone_is_none():
        workers = run.child("gunicorn").children()
        return bool(workers) and all(
            "model.safetensors" in Path(f"/proc/{w.pid}/maps").read_text() for w in workers)
    return False


def api(port: int, key: str, path: str, body: dict) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(), method="POST",
        headers={"X-API-Key": key, "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def mcp_asks_for_sign_in(port: int) -> None:
    """The MCP server answers on the app's own origin, under gunicorn: sign in first."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/mcp", method="POST",
        data=b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}',
        headers={"Content-Type": "application/json",
                 "Accept": "application/json, text/event-stream"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 401
    assert "resource_metadata=" in refused.value.headers["WWW-Authenticate"]


def test_the_readme_example_recalls_by_meaning_and_a_kill_9_takes_the_run_down(runs):
    """The README's curl examples on the default (no EMBEDDER set): the multilingual model
    recalls the saved preference for a paraphrase, a French memory for a French and a
    Chinese question, and says "no match" to what was never saved. "ready" is said once
    the web workers hold the model: no search waits for a load. The same run serves MCP
    beside the pages, and then a kill -9 of the run command alone takes its web server,
    worker and servers down (one run: each costs seconds)."""
    run = runs(env={"EMBEDDER": None})
    assert wait_until(lambda: "==> ready: http://" in run.output() or run.proc.poll() is not None,
                      timeout=240, every=0.2), run.output()[-3000:]
    # The web workers loaded the model before they served: held already, nothing waited for.
    assert web_workers_hold_the_model(run), run.output()[-3000:]
    mcp_asks_for_sign_in(run.port)
    # And the pages still answer (within seconds: a loaded machine may queue the request).
    assert wait_until(lambda: serves(run.port), timeout=15)
    person = Browser(run.port)
    person.post_form("/auth/signin", [("email", "plus@demo.orbitpilot.test"),
                                      ("password", "orbit-demo-2026")])
    created = person.post_form("/settings/keys/", [
        ("name", "README example"), ("scopes", "memory:read"), ("scopes", "memory:write")])
    key = re.search(r'id="api-key-secret"[^>]*value="([^"]+)"', created).group(1)

    saved = api(run.port, key, "/v1/memories", {
        "content": "Prefers aisle seats on long flights.", "source": "chatgpt"})
    assert saved["remembered"] is True
    build = saved["build"]["id"]
    assert wait_until(lambda: run.rows("SELECT status FROM memory_builds WHERE id = %s",
                                       build)[0][0] == "succeeded", timeout=180), \
        run.output()[-3000:]
    assert run.rows("SELECT DISTINCT embedding_model FROM memory_chunks WHERE source_id = %s",
                    saved["memory"]["id"]) == [("use-m3+minilm-l6-v1",)]
    for query in ("seat preference", "what do I like on planes"):
        found = api(run.port, key, "/v1/memories/search", {"query": query, "k": 3})
        assert found["results"][0]["content"] == "Prefers aisle seats on long flights.", query
    french = "Je suis allergique à la pénicilline."
    build = api(run.port, key, "/v1/memories", {"content": french, "source": "chatgpt"})[
        "build"]["id"]
    assert wait_until(lambda: run.rows("SELECT status FROM memory_builds WHERE id = %s",
                                       build)[0][0] == "succeeded", timeout=180)
    for query in ("quel médicament je dois éviter ?", "我对什么药过敏？"):
        found = api(run.port, key, "/v1/memories/search", {"query": query, "k": 3})
        assert found["results"][0]["content"] == french, query
    never = api(run.port, key, "/v1/memories/search",
                {"query": "the boiling point of tungsten", "k": 3})
    assert (never["results"], never["notice"]) == ([], NO_MATCH)
    os.kill(run.proc.pid, signal.SIGKILL)  # only the supervising process
    run.proc.wait(timeout=10)
    # Its children were told by the kernel; the last of them stops the servers.
    assert wait_until(lambda: not listening_on(run.port), timeout=20)
    assert wait_until(lambda: run.left_behind() == [], timeout=30), \
        [p.cmdline() for p in run.left_behind()]
