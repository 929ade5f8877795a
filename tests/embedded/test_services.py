"""The embedded default (§2): real servers, shared between processes, data kept across
restarts, stopped by the last process that used them. Uses its own folder so the suite's
own servers are not disturbed."""

import subprocess
import sys
import textwrap

import psycopg
import redis

from dashboard.embedded import EmbeddedServices, ensure_database


def run_python(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_second_process_reuses_running_servers_and_last_holder_stops_them(tmp_path):
    root = tmp_path / "services"
    services = EmbeddedServices(root)
    urls = services.ensure()
    try:
        ensure_database(urls.postgres_admin, "shared")
        with psycopg.connect(urls.database_url("shared").replace("+psycopg", ""),
                             autocommit=True) as conn:
            conn.execute("CREATE TABLE t (v text)")
            conn.execute("INSERT INTO t VALUES ('from the first process')")
            first_pid = conn.execute("SELECT pg_backend_pid()").fetchone()  # noqa: F841
            postmaster = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE backend_type = 'checkpointer'"
            ).fetchone()[0]
        redis.Redis.from_url(urls.redis).set("k", "v1")

        # A second process (a worker, a CLI command) finds them running and reuses them.
        out = run_python(f"""
            import psycopg, redis
            from dashboard.embedded import EmbeddedServices
            s = EmbeddedServices({str(root)!r})
            u = s.ensure()
            with psycopg.connect(u.database_url("shared").replace("+psycopg", "")) as c:
                print(c.execute("SELECT v FROM t").fetchone()[0])
                print(c.execute("SELECT pid FROM pg_stat_activity "
                                "WHERE backend_type = 'checkpointer'").fetchone()[0])
            print(redis.Redis.from_url(u.redis).get("k").decode())
        """).splitlines()
        assert out == ["from the first process", str(postmaster), "v1"]
        # The child exited; we still hold them, so they still run.
        assert services.status()["postgres"] and services.status()["valkey"]
    finally:
        services.release()
    # We were the last holder: both stopped cleanly.
    assert services.status() == {"postgres": False, "valkey": False, "holders": [],
                                 "root": str(root.resolve())}


def test_stop_and_start_again_keeps_the_data(tmp_path):
    root = tmp_path / "services"
    services = EmbeddedServices(root)
    urls = services.ensure()
    ensure_database(urls.postgres_admin, "keep")
    dsn = urls.database_url("keep").replace("+psycopg", "")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        conn.execute("CREATE TABLE kept (v vector(3))")
        conn.execute("INSERT INTO kept VALUES ('[1,2,3]')")
    redis.Redis.from_url(urls.redis).set("kept", "yes")
    services.stop()
    assert not services.status()["postgres"]

    urls = services.ensure()
    try:
        with psycopg.connect(urls.database_url("keep").replace("+psycopg", "")) as conn:
            assert conn.execute("SELECT v::text FROM kept").fetchone()[0] == "[1,2,3]"
        assert redis.Redis.from_url(urls.redis).get("kept") == b"yes"
    finally:
        services.release()


def test_a_killed_holder_does_not_keep_the_servers_up(tmp_path):
    root = tmp_path / "services"
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from dashboard.embedded import EmbeddedServices
        EmbeddedServices({str(root)!r}).ensure()
        print("up", flush=True)
        time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "up"
    proc.kill()
    proc.wait()
    services = EmbeddedServices(root)
    services.ensure()
    assert services.holders() == [__import__("os").getpid()]
    services.release()
    assert not services.status()["postgres"]
