"""``python -m dashboard.supervisor``: the one process behind ``scripts/run``. It holds the
embedded servers, migrates, seeds the demo data, runs gunicorn and a build worker as its
children and starts again one that dies. Whatever ends the run (Ctrl+C, SIGTERM, restarts
that keep failing) stops them all, work horses included, before it releases the servers.
docs/architecture/run.md says how."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field

import psutil
from flask_migrate import upgrade

from dashboard import create_app
from dashboard.demo import DEMO_PASSWORD, describe_seeded, seed_demo
from dashboard.embedded import EmbeddedError, become_subreaper, die_with_parent
from dashboard.extensions import db

GRACE_SECONDS = 8.0
# A child that dies is started again after FIRST_RESTART_DELAY, twice as long for each
# death within the last RESTART_WINDOW seconds; one death more than RESTARTS_PER_WINDOW
# there means restarts keep failing, and the run stops.
FIRST_RESTART_DELAY = 1.0
RESTART_WINDOW = 60.0
RESTARTS_PER_WINDOW = 5
# gunicorn's default logs the request line, query string included (a page's filters, a
# key someone put in an API URL): the path only, and no referrer.
ACCESS_LOG_FORMAT = '%(h)s %(t)s "%(m)s %(U)s %(H)s" %(s)s %(b)s %(M)sms'


def _say(message: str) -> None:
    print(f"==> {message}", flush=True)


def _healthy(host: str, port: str) -> bool:
    """Whether the web server answers /healthz "ok": its workers hold the model."""
    probe = "127.0.0.1" if host in ("0.0.0.0", "") else host.strip("[]")
    try:
        with urllib.request.urlopen(f"http://{probe}:{port}/healthz", timeout=2) as answer:
            return answer.status == 200
    except (OSError, ValueError):
        return False


def _spawn(args: list[str]) -> subprocess.Popen:
    parent = os.getpid()
    return subprocess.Popen(args, start_new_session=True,
                            preexec_fn=lambda: die_with_parent(parent))


def _tree(process: subprocess.Popen) -> list:
    """The child and every process under it (gunicorn workers, RQ work horses)."""
    try:
        root = psutil.Process(process.pid)
        return [*root.children(recursive=True), root]
    except psutil.NoSuchProcess:
        return []


class RestartPolicy:
    """When a child that died is started again: ``died`` says after how many seconds,
    or None once restarts keep failing."""

    def __init__(self) -> None:
        self.deaths: deque[float] = deque()

    def died(self, at: float) -> float | None:
        self.deaths.append(at)
        while self.deaths[0] <= at - RESTART_WINDOW:
            self.deaths.popleft()
        if len(self.deaths) > RESTARTS_PER_WINDOW:
            return None
        return FIRST_RESTART_DELAY * 2 ** (len(self.deaths) - 1)


@dataclass
class Child:
    """A child the run keeps running: its process, or when to start it again."""

    name: str
    args: list[str]
    process: subprocess.Popen | None = None
    restart_at: float | None = None
    policy: RestartPolicy = field(default_factory=RestartPolicy)

    def start(self) -> None:
        self.process, self.restart_at = _spawn(self.args), None


def describe_exit(returncode: int) -> str:
    """How a child ended, for the log: its exit status or the signal that killed it."""
    if returncode < 0:
        with suppress(ValueError):
            return f"was killed by {signal.Signals(-returncode).name}"
        return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


@contextmanager
def _servers_settled(binding) -> Iterator[set[int]]:
    """The embedded servers' pids (and their guard's), while none starts or stops."""
    if binding is None:
        yield set()
    else:
        with binding.services.settled() as pids:
            yield pids


def stop_orphans(keep: set[int]) -> None:
    """Kill what is left under this process (it is their subreaper), except ``keep``
    and their own children: the embedded servers, released in order afterwards."""
    # What is under us first, then what is under ``keep``: a process forked in between
    # (a live worker's new work horse) is in neither, rather than in the first only.
    under = psutil.Process().children(recursive=True)
    spared = set(keep)
    for pid in keep:
        with suppress(psutil.Error):
            spared |= {p.pid for p in psutil.Process(pid).children(recursive=True)}
    left = [p for p in under if p.pid not in spared]
    for process in left:
        with suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(left, timeout=10)


def stop_children(children: list[subprocess.Popen], grace: float = GRACE_SECONDS,
                  hurry=lambda: False, spare: Callable[[], set[int]] = set) -> None:
    """SIGTERM each child (a warm stop: the worker finishes its build); half-way through
    ``grace`` a second SIGTERM (a cold stop: the worker ends its build and records it
    failed); what still runs after ``grace``, or once ``hurry()`` says so (a second
    Ctrl+C), is killed with its whole tree, but for the pids ``spare()`` names (a
    Valkey the worker started again is in its tree, and stops in order later)."""

    def wait(seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not hurry() \
                and any(c.poll() is None for c in children):
            time.sleep(0.1)

    def terminate() -> None:
        for child in children:
            if child.poll() is None:
                with suppress(ProcessLookupError):
                    child.send_signal(signal.SIGTERM)

    terminate()
    wait(grace / 2)
    terminate()
    wait(grace / 2)
    for child in children:
        if child.poll() is None:
            spared = spare()
            tree = [process for process in _tree(child) if process.pid not in spared]
            for process in tree:
                with suppress(psutil.Error):
                    process.kill()
            psutil.wait_procs(tree, timeout=10)
        with suppress(subprocess.TimeoutExpired):
            child.wait(timeout=10)


class _Stop(Exception):
    pass


def main() -> int:
    requests: list[int] = []
    state = {"stopping": False}

    def on_signal(signum, frame):  # noqa: ARG001
        requests.append(signum)
        if not state["stopping"]:
            raise _Stop  # leaves whatever set-up step is running; the finally cleans up

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, on_signal)
    become_subreaper()

    app = create_app()
    host, port, web_workers = app.config["HOST"], app.config["PORT"], app.config["WEB_WORKERS"]
    binding = app.extensions.get("orbitpilot.embedded")
    children = [
        Child("worker", [sys.executable, "-m", "flask", "worker"]),
        Child("web server", [
            sys.executable, "-m", "gunicorn", "--bind", f"{host}:{port}",
            "--workers", str(web_workers), "--threads", "4", "--graceful-timeout", "5",
            "--access-logfile", "-", "--access-logformat", ACCESS_LOG_FORMAT,
            "--no-control-socket", "--config", "python:dashboard.gunicorn_hooks", "wsgi:app",
        ]),
    ]
    status = 0
    try:
        if binding is not None:
            _say(f"starting the embedded servers under {binding.services.root}")
            binding.ensure_started()
        _say("migrating")
        _migrate(app)
        _say("demo data")
        _seed(app)
        _say("worker")
        children[0].start()
        _say(f"web on http://{host}:{port}")
        children[1].start()
        ready, probed = False, 0.0
        while True:
            if not _watch(children, binding):
                status = 1
                raise _Stop
            if not ready and time.monotonic() - probed >= 1.0:
                # Said once, when a search needs no model load (the workers warm first).
                probed = time.monotonic()
                if _healthy(host, port):
                    ready = True
                    _say(f"ready: http://{host}:{port}")
            time.sleep(0.2)
    except _Stop:
        pass
    except EmbeddedError as exc:  # our own sentence, saying what to look at
        print(f"error: {exc}", file=sys.stderr, flush=True)
        status = 1
    except Exception as exc:
        # The kind only: a database's message can quote the row it refused.
        print(f"error: the run stopped during set-up ({type(exc).__name__}); nothing was "
              "left half-done. Run it again; if it fails the same way, see the lines above.",
              file=sys.stderr, flush=True)
        status = 1
    finally:
        state["stopping"] = True  # from here a signal only shortens the grace period
        _say("stopping")
        stop_children([c.process for c in children if c.process is not None],
                      grace=GRACE_SECONDS, hurry=lambda: len(requests) > 1,
                      spare=binding.services.own_pids if binding is not None else set)
        with _servers_settled(binding) as servers:
            stop_orphans(keep=servers)
        if binding is not None:
            binding.services.release()
            left = binding.services.holders()
            if left:
                _say(f"embedded servers left running for processes {left}")
        _say("stopped")
    return status


def _watch(children: list[Child], binding) -> bool:
    """One round: a child that died has what it left stopped and is started again after
    its delay. False once restarts keep failing."""
    now = time.monotonic()
    for child in children:
        if child.process is not None and child.process.poll() is not None:
            cause = describe_exit(child.process.returncode)
            child.process = None
            # Its orphans (work horses, gunicorn workers holding the port) are ours now,
            # as subreaper: stopped, sparing the other children and the servers.
            live = {c.process.pid for c in children if c.process is not None}
            with _servers_settled(binding) as servers:
                stop_orphans(keep=servers | live)
            if not _again(child, cause, now):
                return False
        elif child.process is None and child.restart_at is not None \
                and now >= child.restart_at:
            try:
                child.start()
            except OSError as exc:
                if not _again(child, f"could not be started ({type(exc).__name__})", now):
                    return False
                continue
            _say(f"{child.name} started again (pid {child.process.pid})")
    return True


def _again(child: Child, cause: str, now: float) -> bool:
    """Plan the start of a child that ended with ``cause``; False (said) if restarts
    keep failing."""
    delay = child.policy.died(now)
    if delay is None:
        _say(f"the {child.name} {cause}, and restarts keep failing ({RESTARTS_PER_WINDOW + 1} "
             f"deaths within {RESTART_WINDOW:g} s); stopping")
        return False
    _say(f"{child.name} {cause}; starting it again in {delay:g} s")
    child.restart_at = now + delay
    return True


def _migrate(app) -> None:
    with app.app_context():
        upgrade()


def _seed(app) -> None:
    with app.app_context():
        seeded = seed_demo(db.session, DEMO_PASSWORD)
        db.session.commit()
        for line in describe_seeded(seeded, DEMO_PASSWORD):
            print(line, flush=True)
        db.session.remove()
        db.engine.dispose()


if __name__ == "__main__":
    raise SystemExit(main())
