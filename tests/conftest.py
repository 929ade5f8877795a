"""Test fixtures: one real PostgreSQL (pgvector) and one real Redis-compatible server.

The test database is created and migrated once per session with the real migrations;
each test runs inside a transaction that is rolled back (services' commits become
savepoints). By default the embedded servers are used; TEST_DATABASE_URL and
TEST_REDIS_URL point the suite at external ones instead.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from flask import has_app_context
from sqlalchemy import event
from sqlalchemy.orm import scoped_session, sessionmaker

from dashboard import create_app
from dashboard.extensions import db
from tests.factories import make_user

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
# Every app and process a test starts builds with the lexical embedder (deterministic,
# instant) unless the test names another: the semantic default is tested by name.
os.environ["EMBEDDER"] = "hashing"
# A database of this run's own: two runs at once (a developer's and an agent's, or CI
# beside a local run) never drop each other's schema. Left-overs of dead runs are dropped.
TEST_DATABASE_PREFIX = "orbitpilot_test_"
TEST_DATABASE = f"{TEST_DATABASE_PREFIX}{os.getpid()}"
# A pytest-xdist worker ("gw0", "gw1"; scripts/test runs the suite on every core) has
# embedded servers of its own besides: PostgreSQL's snapshots span the whole server, so a
# sibling's transactions would change what a test reads (the Memory Status page's dry run
# re-reads what a concurrent transaction might have hidden from the last build).
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
# The audit anchors' key for every app and process of a run: none is generated into the
# repository's instance folder.
TEST_ANCHOR_KEY = "test-audit-anchor-key"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """In CI a skipped test is a failure: a missing service must not pass quietly."""
    outcome = yield
    report = outcome.get_result()
    if IN_CI and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"skipped in CI (CI=true), which counts as a failure: {report.longrepr}"


# A temporary folder of this run's own: pytest sets its shared /tmp/pytest-of-<user> to 0700
# whenever any session starts, which locks the embedded PostgreSQL's system user out of
# the folders another run gave it (initdb: "Permission denied"). Removed after a green run.
RUN_TEMP = Path(tempfile.gettempdir()) / f"orbitpilot-pytest-{os.getpid()}"
DIRT_BEFORE = pytest.StashKey[set]()


REPOSITORY = Path(__file__).resolve().parent.parent


def dirty_paths(root: Path = REPOSITORY) -> set[str]:
    """What ``git status`` lists in the checkout (untracked files too); empty outside git."""
    try:
        done = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"],
                              cwd=root, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return set()
    return set(done.stdout.splitlines()) if done.returncode == 0 else set()


def is_xdist_worker(config) -> bool:
    """A pytest-xdist worker (``-n``): the controller starts it and runs the session hooks
    that speak for the whole run."""
    return hasattr(config, "workerinput")


def pytest_configure(config):
    # Under pytest-xdist a worker is given a folder under the controller's (.../popen-gw0).
    if config.option.basetemp is None:
        config.option.basetemp = str(RUN_TEMP)
    if is_xdist_worker(config):
        # The URL walk's seed is the controller's: the one the report header shows.
        config.option.walk_seed = config.workerinput.get("walk_seed", config.option.walk_seed)
    else:
        if os.environ.get("TEST_DATABASE_URL") and getattr(config.option, "numprocesses", 0):
            # One database that every worker would migrate and wipe at once.
            raise pytest.UsageError("TEST_DATABASE_URL names one database: run the suite "
                                    "in one process (without -n)")
        config.stash[DIRT_BEFORE] = dirty_paths()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_setupnodes(config, specs):
    """pytest-xdist, in the controller, before any worker starts. As root, the embedded
    PostgreSQL runs as a system user that its first start makes (useradd): made here, once,
    as workers starting together on a fresh machine would both run useradd, and one fail."""
    if not os.environ.get("TEST_DATABASE_URL"):
        from dashboard.embedded.postgres import postgres_system_user

        postgres_system_user()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """pytest-xdist, in the controller, before a worker starts."""
    node.workerinput["walk_seed"] = node.config.getoption("walk_seed")


def pytest_sessionfinish(session, exitstatus):
    # A run that leaves the checkout dirty fails, whatever its tests said. Under xdist the
    # controller looks, once every worker is done: a worker looking meanwhile would take a
    # sibling's test at work (test_scripts.py leaves a file for a moment, on purpose) for dirt.
    left = set() if is_xdist_worker(session.config) else \
        dirty_paths() - session.config.stash.get(DIRT_BEFORE, set())
    if left:
        session.config.get_terminal_writer().line(
            "the test run left the checkout dirty (git status):\n  " + "\n  ".join(sorted(left)),
            red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if session.exitstatus == 0 and Path(session.config.option.basetemp) == RUN_TEMP:
        shutil.rmtree(RUN_TEMP, ignore_errors=True)


# -- the URL walk's options (tests/test_url_walk.py) ----------------------------------------

def pytest_addoption(parser):
    group = parser.getgroup("url walk", "tests/test_url_walk.py")
    group.addoption("--full-walk", action="store_true",
                    help="the URL walk sends every malformed case, not a sample of them")
    group.addoption("--walk-seed", type=int, metavar="N",
                    default=random.SystemRandom().randrange(1, 1_000_000),
                    help="the seed of the URL walk's sample, to replay a run "
                         "(default: a fresh one each run)")


def pytest_report_header(config):
    if config.getoption("full_walk"):
        return "url walk: every case (--full-walk)"
    seed = config.getoption("walk_seed")
    return f"url walk: a sample, seed {seed} (replay: --walk-seed {seed}; all: --full-walk)"


def make_test_config(**overrides) -> dict:
    config = {
        "TESTING": True,
        # The lexical embedder: deterministic and instant. Tests of the semantic default
        # (MiniLM) ask for it by name.
        "EMBEDDER": "hashing",
        "EMBEDDED_DATABASE": TEST_DATABASE,
        "PASSWORD_MIN_LENGTH": 10,
        "SERVER_NAME": "localhost",
        "OAUTH_RATE_LIMIT": "100000 per minute", "OAUTH_REGISTER_LIMIT": "100000 per minute",
        # A queue of this run's own: nothing else's jobs, and nothing left for others.
        "BUILD_QUEUE": f"builds-test-{os.getpid()}",
        "BUILD_HEARTBEAT_SECONDS": 0.2,
        # Rate-limit counters of this run's own, reset before each test that uses a client.
        "RATELIMIT_STORAGE_OPTIONS": {"key_prefix": f"LIMITS-test-{os.getpid()}",
                                      "socket_connect_timeout": 2, "socket_timeout": 2},
    }
    if XDIST_WORKER:
        config["EMBEDDED_DIR"] = f"{embedded_dir()}-{XDIST_WORKER}"
    if os.environ.get("TEST_DATABASE_URL"):
        config["SQLALCHEMY_DATABASE_URI"] = os.environ["TEST_DATABASE_URL"]
        config["MIGRATIONS_DATABASE_URI"] = os.environ.get("TEST_DATABASE_OWNER_URL") \
            or os.environ["TEST_DATABASE_URL"]
    if os.environ.get("TEST_REDIS_URL"):
        config["REDIS_URL"] = os.environ["TEST_REDIS_URL"]
    config.update(overrides)
    return config


def embedded_dir() -> Path:
    """Where the app keeps its embedded servers by default (dashboard/config.py)."""
    instance = Path(os.environ.get("ORBITPILOT_INSTANCE") or REPOSITORY / "instance")
    return Path(os.environ.get("ORBITPILOT_EMBEDDED_DIR") or instance / "services").resolve()


def server_admin_url(app) -> str:
    """A superuser on the server's maintenance database (creating and dropping test
    databases): the embedded server's, or TEST_ADMIN_DATABASE_URL."""
    from dashboard.embedded import ensure_started

    if os.environ.get("TEST_ADMIN_DATABASE_URL"):
        return os.environ["TEST_ADMIN_DATABASE_URL"]
    binding = app.extensions.get("orbitpilot.embedded")
    assert binding is not None and binding.postgres, \
        "set TEST_ADMIN_DATABASE_URL to run these tests against an external server"
    ensure_started(app)
    return binding.services.urls().postgres_admin


def fresh_database(admin_url: str, name: str) -> None:
    """Drop ``name`` and make it again, owned by the owner role, with pgvector."""
    import psycopg
    from psycopg import sql

    from dashboard.embedded import ensure_database

    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
                     .format(sql.Identifier(name)))
    ensure_database(admin_url, name)


def _reset_schema(app) -> None:
    """A new test database migrated by the real migrations, as the owner role."""
    from flask_migrate import downgrade, upgrade
    from sqlalchemy import inspect

    with app.app_context():
        if os.environ.get("TEST_DATABASE_URL"):
            # An external database the suite may wipe: back to base, then up again.
            from sqlalchemy import create_engine

            owner = create_engine(app.config["MIGRATIONS_DATABASE_URI"])
            if inspect(owner).has_table("alembic_version"):
                downgrade(revision="base")
            owner.dispose()
        else:
            admin_url = server_admin_url(app)
            _drop_databases_of_dead_runs(admin_url)
            fresh_database(admin_url, app.config["EMBEDDED_DATABASE"])
        db.engine.dispose()
        upgrade()


def _drop_databases_of_dead_runs(admin_url: str) -> None:
    import psycopg
    from psycopg import sql

    from dashboard.embedded import pid_alive

    with psycopg.connect(admin_url, autocommit=True) as conn:
        names = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE %s",
                             (TEST_DATABASE_PREFIX + "%",)).fetchall()
        for (name,) in names:
            # "orbitpilot_test_<pid>", or a scratch database of that run ("…_<pid>_chain").
            pid = name.removeprefix(TEST_DATABASE_PREFIX).split("_", 1)[0]
            if pid.isdigit() and not pid_alive(int(pid)):
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
                             .format(sql.Identifier(name)))


def _drop_own_database(app) -> None:
    import psycopg
    from psycopg import sql

    if os.environ.get("TEST_DATABASE_URL"):
        return
    with app.app_context():
        db.engine.dispose()
    with psycopg.connect(server_admin_url(app), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
                     .format(sql.Identifier(app.config["EMBEDDED_DATABASE"])))


@pytest.fixture(scope="session")
def anchor_environment(tmp_path_factory) -> Iterator[Path]:
    """The audit anchors' key and file for this run, in the environment (so the workers
    and servers the tests start inherit them): anchors go to a temporary folder, never
    into the repository."""
    folder = tmp_path_factory.mktemp("audit-anchors")
    values = {"AUDIT_ANCHOR_KEY": TEST_ANCHOR_KEY,
              "AUDIT_ANCHOR_PATH": str(folder / "anchors.jsonl")}
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    yield folder
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(autouse=True)
def anchors_of_this_test(request, tmp_path_factory) -> Iterator[None]:
    """Each test's own anchor file: its events are rolled back, but anchors written of
    them would stay and contradict the next test's chain."""
    if "app" not in request.fixturenames:
        yield
        return
    app = request.getfixturevalue("app")
    saved = app.config.get("AUDIT_ANCHOR_PATH")
    app.config["AUDIT_ANCHOR_PATH"] = str(tmp_path_factory.mktemp("anchors") / "anchors.jsonl")
    try:
        yield
    finally:
        app.config["AUDIT_ANCHOR_PATH"] = saved


@pytest.fixture(scope="session")
def app(anchor_environment):
    from dashboard.queues import build_queue

    app = create_app(make_test_config())
    _reset_schema(app)
    queue = build_queue(app).rq()
    queue.empty()
    yield app
    queue.empty()
    queue.delete(delete_jobs=True)
    _drop_own_database(app)


class _TestScopedSession(scoped_session):
    """Flask-SQLAlchemy removes the session when any app context pops; inside a test
    that would silently roll back the test's own setup. Only the fixture ends it."""

    def remove(self) -> None:
        pass

    def end(self) -> None:
        super().remove()


@pytest.fixture
def db_session(app) -> Iterator:
    """A session whose work is rolled back at the end of the test, commits included."""
    with app.app_context():
        connection = db.engine.connect()
        transaction = connection.begin()
        # A plain Session: Flask-SQLAlchemy's own picks the engine per table and would
        # ignore the bind, escaping the rollback.
        session = _TestScopedSession(
            sessionmaker(bind=connection, join_transaction_mode="create_savepoint")
        )
        original = db.session
        db.session = session
        try:
            yield session
        finally:
            session.end()
            if transaction.is_active:
                transaction.rollback()
            connection.close()
            db.session = original


@pytest.fixture
def queue(app):
    """This run's build queue, empty before and after the test."""
    from dashboard.queues import build_queue

    queue = build_queue(app).rq()
    queue.empty()
    yield queue
    queue.empty()


@pytest.fixture
def client(app, db_session):
    from dashboard.security import get_limiter

    with app.app_context():
        get_limiter(app).reset()
    return app.test_client()


@pytest.fixture
def runner(app, db_session):
    return app.test_cli_runner()


CSRF_RE = re.compile(r'name="csrf_token"[^>]*value="([^"]+)"')


def csrf_from(client, path: str) -> str:
    html = client.get(path).get_data(as_text=True)
    match = CSRF_RE.search(html)
    assert match, f"no csrf_token on {path}"
    return match.group(1)


@dataclass
class AuthActions:
    client: object

    def login(self, email: str, password: str = "correct-horse-battery"):
        token = csrf_from(self.client, "/auth/signin")
        return self.client.post(
            "/auth/signin", data={"email": email, "password": password, "csrf_token": token}
        )

    def logout(self):
        token = csrf_from(self.client, "/")
        return self.client.post("/auth/signout", data={"csrf_token": token})


@pytest.fixture
def auth(client) -> AuthActions:
    return AuthActions(client)


@pytest.fixture
def user(db_session, auth, queue):
    """A user on the default plan, signed in on ``client``."""
    user = make_user(db_session)
    assert auth.login(user.email).status_code == 302
    return user


@dataclass
class QueryCounter:
    statements: list[str] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.statements)


@pytest.fixture
def count_queries(app) -> Callable:
    """``with count_queries() as q: ...; assert q.count == 1`` (SQL statements sent by this
    thread: a build's heartbeat thread stamps on a clock, not per statement of the code)."""

    @contextmanager
    def counter() -> Iterator[QueryCounter]:
        recorded = QueryCounter()
        mine = threading.get_ident()

        def before(conn, cursor, statement, parameters, context, executemany):
            # Savepoint bookkeeping is the test harness's, not the code's.
            if threading.get_ident() == mine and not statement.lstrip().upper().startswith(
                    ("SAVEPOINT", "RELEASE", "ROLLBACK")):
                recorded.statements.append(statement)

        if has_app_context():
            engine = db.engine
        else:
            with app.app_context():
                engine = db.engine
        event.listen(engine, "before_cursor_execute", before)
        try:
            yield recorded
        finally:
            event.remove(engine, "before_cursor_execute", before)

    return counter


@pytest.fixture(scope="session")
def project_root() -> Path:
    return Path(__file__).resolve().parent.parent


@dataclass
class Committed:
    """Factories whose rows are really committed (visible to worker processes); the users
    and plans made are deleted after the test, with everything that cascades from them."""

    session: object
    users: list[int] = field(default_factory=list)
    plans: list[int] = field(default_factory=list)

    def user(self, **kwargs):
        from tests.factories import make_user

        user = make_user(self.session, **kwargs)
        self.users.append(user.id)
        return user

    def plan(self, **kwargs):
        from tests.factories import make_plan

        plan = make_plan(self.session, **kwargs)
        self.plans.append(plan.id)
        return plan


@pytest.fixture
def committed(app) -> Iterator[Committed]:
    from sqlalchemy import delete

    from dashboard.auth.models import User
    from dashboard.plans.models import Plan

    with app.app_context():
        helper = Committed(db.session)
        try:
            yield helper
        finally:
            db.session.rollback()
            if helper.users:
                db.session.execute(delete(User).where(User.id.in_(helper.users)))
            if helper.plans:
                db.session.execute(delete(Plan).where(Plan.id.in_(helper.plans)))
            db.session.commit()
            db.session.remove()
