"""``python -m dashboard.supervisor``: the one process behind ``scripts/run``. It holds the
embedded servers, migrates, seeds the demo data, runs gunicorn and a build worker as its
children, and whatever ends the run (Ctrl+C, SIGTERM, a child that dies) stops them all,
work horses included, before it releases the servers. docs/architecture/run.md says how."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import suppress

import psutil
from flask_migrate import upgrade

from dashboard import create_app
from dashboard.demo import DEMO_PASSWORD, describe_seeded, seed_demo
from dashboard.embedded import EmbeddedError, become_subreaper, die_with_parent
from dashboard.extensions import db

GRACE_SECONDS = 8.0
# gunicorn's default logs the request line, query string included (a page's filters, a
# key someone put in an API URL): the path only, and no referrer.
ACCESS_LOG_FORMAT = '%(h)s %(t)s "%(m)s %(U)s %(H)s" %(s)s %(b)s %(M)sms'


def _say(message: str) -> None:
    print(f"==> {message}", flush=True)


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


def stop_orphans(keep: set[int]) -> None:
    """Kill what is left under this process (it is their subreaper), except ``keep``
    and their own children: the embedded servers, released in order afterwards."""
    me = psutil.Process()
    spared = set(keep)
    for pid in keep:
        with suppress(psutil.Error):
            spared |= {p.pid for p in psutil.Process(pid).children(recursive=True)}
    left = [p for p in me.children(recursive=True) if p.pid not in spared]
    for process in left:
        with suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(left, timeout=10)


def stop_children(children: list[subprocess.Popen], grace: float = GRACE_SECONDS,
                  hurry=lambda: False) -> None:
    """SIGTERM each child (a warm stop: the worker finishes its build); half-way through
    ``grace`` a second SIGTERM (a cold stop: the worker ends its build and records it
    failed); what still runs after ``grace``, or once ``hurry()`` says so (a second
    Ctrl+C), is killed with its whole tree."""

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
            tree = _tree(child)
            for process in tree:
                with suppress(psutil.Error):
                    process.kill()
            psutil.wait_procs(tree, timeout=10)
        with suppress(subprocess.TimeoutExpired):
            child.wait(timeout=10)


class _Stop(Exception):
    pass


def main() -> int:
    host = os.environ.get("HOST", "127.0.0.1")
    port = os.environ.get("PORT", "5000")
    web_workers = os.environ.get("WEB_WORKERS", "2")
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
    binding = app.extensions.get("orbitpilot.embedded")
    children: list[subprocess.Popen] = []
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
        children.append(_spawn([sys.executable, "-m", "flask", "worker"]))
        _say(f"web on http://{host}:{port}")
        children.append(_spawn([
            sys.executable, "-m", "gunicorn", "--bind", f"{host}:{port}",
            "--workers", web_workers, "--threads", "4", "--graceful-timeout", "5",
            "--access-logfile", "-", "--access-logformat", ACCESS_LOG_FORMAT,
            "--no-control-socket", "wsgi:app",
        ]))
        while True:
            for child in children:
                if child.poll() is not None:
                    _say(f"{'worker' if child is children[0] else 'web server'} exited "
                         f"({child.returncode}); stopping")
                    status = child.returncode or 1
                    raise _Stop
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
        stop_children(children, grace=GRACE_SECONDS, hurry=lambda: len(requests) > 1)
        stop_orphans(keep=binding.services.own_pids() if binding is not None else set())
        if binding is not None:
            binding.services.release()
            left = binding.services.holders()
            if left:
                _say(f"embedded servers left running for processes {left}")
        _say("stopped")
    return status


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
