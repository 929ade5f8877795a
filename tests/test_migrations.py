"""The migrations create the whole schema and remove it cleanly (``downgrade base``)."""

import uuid

import pytest
from flask_migrate import downgrade, upgrade
from sqlalchemy import create_engine, inspect, text

from dashboard import create_app
from dashboard.extensions import db
from tests.conftest import make_test_config

EXPECTED_TABLES = {
    "users", "plans", "source_assignments", "profile_facts", "blinks", "conversations",
    "messages", "documents", "memories", "memory_versions", "forget_markers",
    "memory_chunks", "memory_builds", "api_keys", "audit_events", "audit_checkpoints",
}


@pytest.fixture
def scratch_app(app):
    """An app on a database of its own, dropped afterwards."""
    name = f"orbitpilot_migrate_{uuid.uuid4().hex[:8]}"
    with app.app_context():
        base_url = db.engine.url
    admin = create_engine(base_url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    scratch = create_app(make_test_config(
        SQLALCHEMY_DATABASE_URI=base_url.set(database=name).render_as_string(False)))
    try:
        yield scratch
    finally:
        with scratch.app_context():
            db.engine.dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def test_upgrade_creates_everything_and_downgrade_removes_it(scratch_app):
    with scratch_app.app_context():
        upgrade()
        inspector = inspect(db.engine)
        tables = set(inspector.get_table_names())
        assert tables >= EXPECTED_TABLES
        with db.engine.connect() as conn:
            assert conn.scalar(text("SELECT extversion FROM pg_extension "
                                    "WHERE extname = 'vector'")) >= "0.8"
            index = conn.scalar(text("SELECT indexdef FROM pg_indexes "
                                     "WHERE indexname = 'ix_memory_chunks_embedding_hnsw'"))
            assert "hnsw" in index and "vector_cosine_ops" in index
            assert conn.scalar(text("SELECT count(*) FROM plans WHERE is_default")) == 1
            triggers = conn.scalars(text(
                "SELECT tgname FROM pg_trigger WHERE tgrelid = 'audit_events'::regclass "
                "AND NOT tgisinternal ORDER BY tgname")).all()
            assert triggers == ["audit_events_no_truncate", "audit_events_no_update_delete"]
        db.engine.dispose()

        downgrade(revision="base")
        inspector = inspect(db.engine)
        assert set(inspector.get_table_names()) <= {"alembic_version"}
        with db.engine.connect() as conn:
            assert conn.scalar(text("SELECT count(*) FROM pg_extension "
                                    "WHERE extname = 'vector'")) == 0
            assert conn.scalar(text("SELECT count(*) FROM pg_proc "
                                    "WHERE proname = 'audit_events_refuse_change'")) == 0
        db.engine.dispose()

        upgrade()  # and back up again, cleanly
        assert set(inspect(db.engine).get_table_names()) >= EXPECTED_TABLES
        db.engine.dispose()


def test_models_match_the_migrations(app):
    """Autogenerate against the migrated test database finds nothing to add."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    with app.app_context(), db.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), db.metadata)
    assert diff == []
