"""The owner's session the tampering tests of the audit log use."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session, sessionmaker

from tests.conftest import _TestScopedSession


@pytest.fixture
def owner_session(app) -> Iterator[Session]:
    """A session as the owner role on one connection in one transaction, rolled back at
    the end (the trigger switch with it). A plain ``Session`` would not survive the CLI's
    app context ending (Flask-SQLAlchemy calls ``remove`` then)."""
    engine = create_engine(app.config["MIGRATIONS_DATABASE_URI"])
    connection = engine.connect()
    transaction = connection.begin()
    # Fail instead of waiting forever if another connection holds the table.
    connection.execute(text("SET LOCAL lock_timeout = '10s'"))
    session = _TestScopedSession(sessionmaker(bind=connection,
                                              join_transaction_mode="create_savepoint"))
    try:
        yield session
    finally:
        session.end()
        transaction.rollback()
        connection.close()
        engine.dispose()
