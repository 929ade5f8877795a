"""The embedded default: real servers, shared between processes, data kept across
restarts, stopped by the last process that used them, and safe to kill at any moment.
Each test uses folders of its own, so the suite's own servers are not disturbed."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import psycopg
import pytest
import redis

from dashboard.embedded import (
    EmbeddedError,
    EmbeddedServices,
    ensure_database,
)
from tests.embedded.procs import CpuLoad, servers_of, wait_until

pytestmark = pytest.mark.processes  # real processes or servers: slow

ROOT = Path(__file__).resolve().parents[2]


def run_python(code: str, timeout: float = 180, **env: str) -> str:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                            text=True, timeout=timeout, cwd=ROOT, env={**os.environ, **env})
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip()


def start_holder(root: Path) -> subprocess.Popen:
    """Another process holding the servers of ``root`` (read its first line: "up")."""
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from dashboard.embedded import EmbeddedServices
        EmbeddedServices({str(root)!r}).ensure()
        print("up", flush=True)
        time.sleep(120)
    """)], stdout=subprocess.PIPE, text=True, cwd=ROOT)


def superuser(services: EmbeddedServices, database: str) -> str:
    return psycopg.conninfo.make_conninfo(services.urls().postgres_admin, dbname=database)


def test_second_process_reuses_running_servers_and_last_holder_stops_them(tmp_path):
    root = tmp_path / "services"
    services = EmbeddedServices(root)
    urls = services.ensure()
    try:
        ensure_database(urls.postgres_admin, "shared")
        with psycopg.connect(superuser(services, "shared"), autocommit=True) as conn:
            conn.execute("CREATE TABLE t (v text)")
            conn.execute("INSERT INTO t VALUES ('from the first process')")
            postmaster = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE backend_type = 'checkpointer'"
            ).fetchone()[0]
        redis.Redis.from_url(urls.redis).set("k", "v1")

        # A second process (a worker, a CLI command) finds them running and reuses them.
        out = run_python(f"""
            import psycopg, psycopg.conninfo, redis
            from dashboard.embedded import EmbeddedServices
            s = EmbeddedServices({str(root)!r})
            u = s.ensure()
            dsn = psycopg.conninfo.make_conninfo(u.postgres_admin, dbname="shared")
            with psycopg.connect(dsn) as c:
                print(c.execute("SELECT v FROM t").fetchone()[0])
                print(c.execute("SELECT pid FROM pg_stat_activity "
                                "WHERE backend_type = 'checkpointer'").fetchone()[0])
            print(redis.Redis.from_url(u.redis).get("k").decode())
        """).splitlines()
        assert out == ["from the first process", str(postmaster), "v1"]
        # The child exited; we still hold them, so they still run.
        status = services.status()
        assert (status["postgres"], status["valkey"]) == ("running", "running")
    finally:
        services.release()
    # We were the last holder: both stopped cleanly, nothing of them left.
    status = services.status()
    assert (status["postgres"], status["valkey"], status["holders"]) == \
        ("stopped", "stopped", [])
    assert servers_of(root) == []


def test_stop_and_start_again_keeps_the_data(tmp_path):
    services = EmbeddedServices(tmp_path / "services")
    urls = services.ensure()
    ensure_database(urls.postgres_admin, "keep")
    with psycopg.connect(superuser(services, "keep"), autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (v vector(3))")
        conn.execute("INSERT INTO kept VALUES ('[1,2,3]')")
    redis.Redis.from_url(urls.redis).set("kept", "yes")
    assert services.stop() == []
    assert services.status()["postgres"] == "stopped"

    urls = services.ensure()
    try:
        with psycopg.connect(superuser(services, "keep")) as conn:
            assert conn.execute("SELECT v::text FROM kept").fetchone()[0] == "[1,2,3]"
        assert redis.Redis.from_url(urls.redis).get("kept") == b"yes"
    finally:
        services.release()


def test_a_killed_holder_is_pruned_and_does_not_keep_the_servers_up(tmp_path):
    root = tmp_path / "services"
    proc = start_holder(root)
    assert proc.stdout.readline().strip() == "up"
    services = EmbeddedServices(root)
    assert services.holders() == [proc.pid]
    proc.kill()
    proc.wait()
    assert services.holders() == []  # the dead pid is pruned
    services.ensure()
    assert services.holders() == [os.getpid()]
    services.release()
    assert services.status()["postgres"] == "stopped"
    assert servers_of(root) == []


def test_the_guard_stops_the_servers_once_the_last_holder_was_killed_outright(tmp_path):
    # kill -9 runs no atexit release: without the guard they would run for nobody.
    root = tmp_path / "services"
    proc = start_holder(root)
    assert proc.stdout.readline().strip() == "up"
    services = EmbeddedServices(root)
    guard = services.guard_pid()
    assert guard is not None and len(servers_of(root)) == 2
    proc.kill()
    proc.wait()
    assert wait_until(lambda: servers_of(root) == [], timeout=20)
    assert wait_until(lambda: not psutil.pid_exists(guard) or
                      psutil.Process(guard).status() == psutil.STATUS_ZOMBIE, timeout=10)


def test_the_guard_leaves_servers_alone_while_a_holder_lives(tmp_path):
    root = tmp_path / "services"
    services = EmbeddedServices(root)
    services.ensure()
    try:
        proc = start_holder(root)
        assert proc.stdout.readline().strip() == "up"
        proc.kill()
        proc.wait()
        time.sleep(2.5)  # two of the guard's rounds
        status = services.status()
        assert (status["postgres"], status["valkey"]) == ("running", "running")
        assert services.guard_pid() is not None
    finally:
        services.release()
    assert servers_of(root) == []


def test_sigterm_to_a_holder_still_setting_up_ends_it_through_its_release(tmp_path):
    # SIGTERM's default action skips atexit; a holder turns it into SystemExit instead.
    root = tmp_path / "services"
    proc = start_holder(root)
    assert proc.stdout.readline().strip() == "up"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM  # exited, not killed by it
    assert servers_of(root) == []  # its release stopped them, not the guard later


def test_stop_refuses_while_another_process_holds_them_unless_forced(tmp_path):
    root = tmp_path / "services"
    proc = start_holder(root)
    try:
        assert proc.stdout.readline().strip() == "up"
        services = EmbeddedServices(root)
        assert services.stop() == [proc.pid]
        assert services.status()["postgres"] == "running"
        assert services.stop(force=True) == []
        assert services.status()["postgres"] == "stopped"
        assert services.status()["valkey"] == "stopped"
    finally:
        proc.kill()
        proc.wait()


def test_services_commands_start_nothing_and_tell_the_truth(tmp_path):
    env = {"ORBITPILOT_INSTANCE": str(tmp_path / "instance"), "FLASK_APP": "wsgi.py",
           "DATABASE_URL": "", "REDIS_URL": ""}  # empty: the embedded default
    out = run_python("""
        from flask.cli import main
        import sys
        sys.argv = ["flask", "services", "status"]
        main()
    """, **env)
    assert '"postgres": "stopped"' in out and '"valkey": "stopped"' in out
    services_root = tmp_path / "instance" / "services"
    assert not (services_root / "pgdata").exists()  # no initdb, no server
    assert servers_of(services_root) == []

    # With a holder alive, `stop` refuses and says who holds them; --force stops them.
    holder = start_holder(services_root)
    try:
        assert holder.stdout.readline().strip() == "up"
        # `stop`, then `status`, as the flask command runs them (one process for both:
        # each start of Python and the app costs seconds).
        both = run_python("""
            import json
            from flask.cli import FlaskGroup
            from click.testing import CliRunner
            runner = CliRunner()
            cli = FlaskGroup()
            stop = runner.invoke(cli, ["services", "stop"])
            status = runner.invoke(cli, ["services", "status"])
            print(json.dumps({"code": stop.exit_code, "stop": stop.output,
                              "status": status.output, "status_code": status.exit_code}))
        """, **env)
        results = json.loads(both.splitlines()[-1])
        assert results["code"] == 1
        assert f"Still in use by processes {holder.pid}" in results["stop"]
        assert "Traceback" not in results["stop"]
        assert results["status_code"] == 0
        assert '"postgres": "running"' in results["status"] and str(holder.pid) in \
            results["status"]
        forced = subprocess.run([sys.executable, "-m", "flask", "services", "stop", "--force"],
                                capture_output=True, text=True, cwd=ROOT,
                                env={**os.environ, **env}, timeout=120)
        assert forced.returncode == 0, forced.stderr
        assert servers_of(services_root) == []
    finally:
        holder.kill()
        holder.wait()


def test_three_first_starts_in_fresh_folders_on_a_loaded_machine(tmp_path):
    """The first run of a fresh clone: app, embedded servers, migrations, a real query —
    three at once, each in a fresh folder, while other processes keep both cores busy
    (spinners top the machine up to that; in the whole suite, other tests do)."""
    script = textwrap.dedent("""
        import sys
        from flask_migrate import upgrade
        from sqlalchemy import text
        from dashboard import create_app
        from dashboard.extensions import db
        app = create_app({"INSTANCE_PATH": sys.argv[1]})
        with app.app_context():
            upgrade()
            print(db.session.scalar(text("SELECT name FROM plans WHERE is_default")))
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    roots = [tmp_path / f"clone-{i}" for i in range(3)]
    with CpuLoad(processes=2, top_up=True):
        starts = [subprocess.Popen([sys.executable, "-c", script, str(root)], cwd=ROOT,
                                   env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True)
                  for root in roots]
        for proc, root in zip(starts, roots, strict=True):
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, f"{root.name}: {err[-2000:]}"
            assert out.strip().splitlines()[-1] == "Free", root.name
    for root in roots:
        # Every start also stopped: the process that started them was their last holder.
        assert servers_of(root / "services") == [], root.name


def test_sigkill_during_initdb_then_a_clean_start(tmp_path):
    root = tmp_path / "services"
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        from dashboard.embedded import EmbeddedServices
        EmbeddedServices({str(root)!r}).ensure()
    """)], cwd=ROOT)
    try:
        assert wait_until(lambda: any(root.glob("pgdata.init-*/PG_VERSION")), timeout=60), \
            "initdb never started"
        assert not (root / "pgdata").exists()  # killed while initdb is at work
        proc.kill()
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    # The kernel stopped initdb with its parent: nothing writes into the staging folder.
    assert wait_until(lambda: servers_of(root, "initdb") == [], timeout=10)

    services = EmbeddedServices(root)
    services.ensure()
    try:
        ensure_database(services.urls().postgres_admin, "after")
        with psycopg.connect(superuser(services, "after")) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        assert list(root.glob("pgdata.init-*")) == []
    finally:
        services.release()


def _initdb_at_work(root: Path) -> tuple[psutil.Process, psutil.Process] | None:
    """initdb of ``root`` and a postgres child it runs a step in (bootstrap, single-user
    mode), if it is at such a step now."""
    for proc in servers_of(root, "initdb"):
        with contextlib.suppress(psutil.Error):
            for child in proc.children(recursive=True):
                if child.name() == "postgres":
                    return proc, child
    return None


def _running(proc: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    return False


def test_a_starter_killed_during_initdb_takes_initdb_and_its_children_with_it(tmp_path):
    root = tmp_path / "services"
    starter = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        from dashboard.embedded import EmbeddedServices
        EmbeddedServices({str(root)!r}).ensure()
    """)], cwd=ROOT, start_new_session=True)  # its own group, like a shell job
    tree: list[psutil.Process] = []
    try:
        frozen = None
        deadline = time.monotonic() + 60
        while frozen is None and time.monotonic() < deadline:
            found = _initdb_at_work(root)
            with contextlib.suppress(psutil.Error):
                if found:
                    # A step that takes long (a loaded machine, a slow disk): its postgres
                    # is frozen, so initdb cannot finish the step by itself.
                    child = found[1]
                    child.suspend()
                    if wait_until(lambda c=child: c.status() == psutil.STATUS_STOPPED, 1):
                        frozen = found  # not a step that ended before the signal came
        assert frozen is not None, "initdb never ran a step in a postgres of its own"
        initdb = frozen[0]
        tree = [initdb, *initdb.children(recursive=True)]
        os.killpg(starter.pid, signal.SIGKILL)  # the whole group: what a terminal kill does
        starter.wait(timeout=10)
        assert wait_until(lambda: not any(_running(p) for p in tree), timeout=10), \
            [(p.pid, p.name()) for p in tree if _running(p)]
        assert servers_of(root) == []
    finally:
        if starter.poll() is None:
            starter.kill()
        for proc in tree:
            with contextlib.suppress(psutil.Error):
                proc.kill()

    services = EmbeddedServices(root)  # the next start works
    services.ensure()
    try:
        with psycopg.connect(superuser(services, "postgres")) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        assert list(root.glob("pgdata.init-*")) == []
    finally:
        services.release()


def test_an_unfinished_data_folder_is_made_again(tmp_path):
    root = tmp_path / "services"
    pgdata = root / "pgdata"
    (pgdata / "base" / "1").mkdir(parents=True)  # what a killed initdb of old left behind
    (pgdata / "PG_VERSION").write_text("18\n")
    services = EmbeddedServices(root)
    services.ensure()
    try:
        with psycopg.connect(superuser(services, "postgres")) as conn:
            assert conn.execute("SELECT current_database()").fetchone() == ("postgres",)
    finally:
        services.release()


def test_a_broken_data_folder_that_holds_databases_is_set_aside_never_deleted(tmp_path):
    root = tmp_path / "services"
    pgdata = root / "pgdata"
    (pgdata / "base" / "16384").mkdir(parents=True)
    (pgdata / "base" / "16384" / "1259").write_text("someone's data")
    (pgdata / "PG_VERSION").write_text("18\n")
    services = EmbeddedServices(root)
    with pytest.raises(EmbeddedError, match="was moved to .*pgdata.set-aside-") as refused:
        services.ensure()
    (aside,) = root.glob("pgdata.set-aside-*")
    assert str(aside) in str(refused.value)
    assert (aside / "base" / "16384" / "1259").read_text() == "someone's data"
    assert servers_of(root) == []
    services.ensure()  # the next start makes a new cluster beside it
    services.release()
    assert (aside / "base" / "16384" / "1259").exists()


def test_a_checkout_in_a_deep_folder_works(tmp_path):
    deep = tmp_path
    while len(str(deep / "services" / "run" / "valkey.sock")) <= 140:
        deep = deep / "a-rather-long-folder-name"
    services = EmbeddedServices(deep / "services")
    urls = services.ensure()
    try:
        assert len(os.fsencode(urls.socket_dir)) < 60
        assert redis.Redis.from_url(urls.redis).ping()
        with psycopg.connect(superuser(services, "postgres")) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        services.release()
    assert servers_of(deep / "services") == []


def test_a_server_that_fails_to_start_does_not_leave_the_other_running(tmp_path):
    class NoValkey(EmbeddedServices):
        def _ensure_valkey(self) -> bool:
            raise EmbeddedError("embedded Valkey did not start")

    root = tmp_path / "services"
    services = NoValkey(root)
    with pytest.raises(EmbeddedError, match="Valkey did not start"):
        services.ensure()
    assert services.status()["postgres"] == "stopped"
    assert servers_of(root) == []
    assert services.holders() == []


def test_sigint_to_a_holder_during_start_leaves_nothing_behind(tmp_path):
    root = tmp_path / "services"
    # Ctrl+C raises KeyboardInterrupt in the holder, as at a terminal, even when this run
    # was started in the background (where SIGINT is inherited ignored).
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import signal, time
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from dashboard.embedded import EmbeddedServices
        s = EmbeddedServices({str(root)!r})
        try:
            s.ensure()
            time.sleep(120)
        finally:
            s.release()
    """)], cwd=ROOT)
    assert wait_until(lambda: (root / "pgdata").exists() or any(root.glob("pgdata.init-*")),
                      timeout=60)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)
    assert wait_until(lambda: servers_of(root) == [], timeout=15)
    services = EmbeddedServices(root)
    services.ensure()
    services.release()


def test_a_planted_socket_folder_is_refused_never_used(tmp_path):
    deep = tmp_path
    while len(str(deep / "services" / "run" / "valkey.sock")) <= 140:
        deep = deep / "a-rather-long-folder-name"
    services = EmbeddedServices(deep / "services")
    planted = services.socket_dir
    planted.mkdir(parents=True, exist_ok=True)
    os.chown(planted, 65534, 65534)  # someone else's folder, under the guessable name
    try:
        with pytest.raises(EmbeddedError, match="was not made by this set-up"):
            services.ensure()
        assert servers_of(deep / "services") == []
        assert os.stat(planted).st_uid == 65534  # not taken over (no chmod, no chown)
    finally:
        planted.rmdir()


def test_the_guard_loads_neither_flask_nor_the_app_nor_psycopg():
    # What the guard process loads, as ``python -m dashboard.embedded.guard`` loads it.
    out = run_python("""
        import sys
        import dashboard.embedded.guard
        print(sorted(m for m in sys.modules
                     if m.split(".")[0] in ("flask", "werkzeug", "sqlalchemy", "psycopg")
                     or m.startswith("dashboard.") and not m.startswith("dashboard.embedded")))
    """)
    assert out == "[]"


def test_a_valkey_that_stopped_answering_is_replaced_not_duplicated(tmp_path):
    root = tmp_path / "services"
    first = EmbeddedServices(root)
    first.ensure(postgres=False)
    frozen = first.valkey.pid()
    os.kill(frozen, signal.SIGSTOP)  # alive, but answers nothing

    class Impatient(EmbeddedServices):
        answer_grace = 1.0

    second = Impatient(root)
    try:
        second.ensure(postgres=False, hold=False)
        valkeys = servers_of(root, "valkey-server")
        assert len(valkeys) == 1 and valkeys[0].pid != frozen  # the frozen one is gone
        assert redis.Redis.from_url(second.urls().redis).ping()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(frozen, signal.SIGKILL)
        first.release()
    assert servers_of(root) == []


def test_a_stale_pid_file_naming_another_live_process_does_not_block_the_start(tmp_path):
    root = tmp_path / "services"
    services = EmbeddedServices(root)
    services.ensure(redis=False)
    services.release()
    # After a reboot the old pid may belong to anyone: here, to this test process.
    (root / "pgdata" / "postmaster.pid").write_text(f"{os.getpid()}\n{root / 'pgdata'}\n")
    services.ensure(redis=False)
    try:
        assert services.status()["postgres"] == "running"
    finally:
        services.release()
