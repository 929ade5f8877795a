"""PostgreSQL set-up shared by the app, the migrations and the tests.

Two roles: the **owner** owns the database objects and runs migrations; the **app**
role is what the web and worker processes connect as. It owns nothing, so it cannot
``ALTER TABLE … DISABLE TRIGGER``, and it may only read and append to the audit log:
the log's append-only promise holds against the app itself. After every migration the
app role's privileges are granted again (``grant_app_privileges``), so a new table is
never out of its reach nor an old one more than it should be."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Connection, make_url

# Tables the app may only read and append to.
APPEND_ONLY_TABLES = ("audit_events", "audit_checkpoints")
# Tables the app VACUUMs after redactions and hard deletes (memories.erasure): the memory
# tables, and where an erasure rewrites or deletes copies (chat replies, export pieces).
# MAINTAIN on these alone, PostgreSQL 17+ (before that only an owner may VACUUM a table).
VACUUMED_TABLES = ("memories", "memory_versions", "memory_chunks", "messages",
                   "data_export_parts")
MAINTAIN_SINCE = 170000  # server_version_num


def normalise_database_url(url: str) -> str:
    """Accept the usual spellings and always use the psycopg 3 driver."""
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    if not url.startswith("postgresql+psycopg://"):
        raise ValueError("DATABASE_URL must be a PostgreSQL URL (postgresql://...)")
    return url


def app_role_for(app_url: str, owner_url: str) -> str | None:
    """The role to grant to: the app URL's user, when it is not the owner's."""
    app_user, owner_user = make_url(app_url).username, make_url(owner_url).username
    return app_user if app_user and app_user != owner_user else None


def grant_app_privileges(connection: Connection, role: str) -> None:
    """Everything the app needs on the current schema, and nothing more."""
    quoted = connection.dialect.identifier_preparer.quote(role)
    statements = [
        f"GRANT USAGE ON SCHEMA public TO {quoted}",
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {quoted}",
        f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {quoted}",
        f"REVOKE TRUNCATE, REFERENCES, TRIGGER ON ALL TABLES IN SCHEMA public FROM {quoted}",
        f"REVOKE INSERT, UPDATE, DELETE ON alembic_version FROM {quoted}",
    ]
    statements += [f"REVOKE UPDATE, DELETE ON {table} FROM {quoted}"
                   for table in APPEND_ONLY_TABLES
                   if connection.dialect.has_table(connection, table)]
    server = int(connection.scalar(text("SELECT current_setting('server_version_num')")))
    if server >= MAINTAIN_SINCE:
        statements.append(f"REVOKE MAINTAIN ON ALL TABLES IN SCHEMA public FROM {quoted}")
        vacuumed = [table for table in VACUUMED_TABLES
                    if connection.dialect.has_table(connection, table)]
        if vacuumed:
            statements.append(f"GRANT MAINTAIN ON TABLE {', '.join(vacuumed)} TO {quoted}")
    for statement in statements:
        connection.execute(text(statement))
