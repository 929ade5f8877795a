"""What the benchmarks share: a database of their own on the embedded server, an app on it
migrated with the real migrations, and two small measuring tools.

A bench script puts the repository on ``sys.path`` first, then imports from here."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, create_engine, event, text

from dashboard import create_app
from dashboard.extensions import db

PASSWORD = "bench-password-123"
CSRF = re.compile(r'name="csrf_token"[^>]*value="([^"]+)"')


def fresh_database(name: str) -> tuple[Any, Engine]:
    """Start the embedded servers and make database ``name`` anew (dropped first if a run
    left it; owned by the owner role, with pgvector). Returns the servers' URLs and the
    superuser's AUTOCOMMIT engine, which ``drop_database`` takes at the end."""
    from dashboard.embedded import ensure_database, ensure_started

    base = create_app()
    binding = base.extensions["orbitpilot.embedded"]
    ensure_started(base)
    urls = binding.services.urls()
    admin = create_engine(urls.postgres_admin.replace("postgresql://", "postgresql+psycopg://"),
                          isolation_level="AUTOCOMMIT")
    drop_database(admin, name)
    ensure_database(urls.postgres_admin, name)
    return urls, admin


def drop_database(admin: Engine, name: str) -> None:
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def migrated_app(config: dict[str, Any]):
    """``create_app(config)``, its database upgraded to the latest migration (as
    ``MIGRATIONS_DATABASE_URI``'s role) and its pool emptied after."""
    from flask_migrate import upgrade

    app = create_app(config)
    with app.app_context():
        upgrade()
        db.engine.dispose()
    return app


def signed_in(app, email: str):
    """A test client of ``app``, signed in as ``email`` (whose password is PASSWORD)."""
    client = app.test_client()
    token = CSRF.search(client.get("/auth/signin").get_data(as_text=True)).group(1)
    response = client.post("/auth/signin", data={"email": email, "password": PASSWORD,
                                                  "csrf_token": token})
    assert response.status_code == 302, response.status_code
    return client


def ms(seconds: float) -> str:
    return f"{seconds * 1000:,.1f} ms"


@contextmanager
def counted(engine) -> Iterator[list[str]]:
    """The SQL statements ``engine`` sends inside the block."""
    statements: list[str] = []

    def before(conn, cursor, statement, parameters, context, executemany):
        statements.append(statement)

    event.listen(engine, "before_cursor_execute", before)
    try:
        yield statements
    finally:
        event.remove(engine, "before_cursor_execute", before)
