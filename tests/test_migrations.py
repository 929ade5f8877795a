"""The migrations create the whole schema and remove it cleanly (``downgrade base``)."""

import uuid

import psycopg
import pytest
from flask_migrate import downgrade, upgrade
from sqlalchemy import inspect, text
from sqlalchemy.engine import make_url

from dashboard import create_app
from dashboard.extensions import db
from tests.conftest import fresh_database, make_test_config, server_admin_url

EXPECTED_TABLES = {
    "users", "plans", "source_assignments", "profile_facts", "blinks", "conversations",
    "messages", "documents", "memories", "memory_versions", "forget_markers",
    "memory_chunks", "memory_builds", "api_keys", "audit_events", "audit_checkpoints",
    "maintenance_leases",
}


@pytest.fixture
def scratch_app(app):
    """An app on a database of its own (owner and app roles, as the real set-up), dropped
    afterwards."""
    name = f"orbitpilot_migrate_{uuid.uuid4().hex[:8]}"
    admin_url = server_admin_url(app)
    fresh_database(admin_url, name)
    with app.app_context():
        app_url, owner_url = (make_url(app.config[key]).set(database=name)
                              .render_as_string(False)
                              for key in ("SQLALCHEMY_DATABASE_URI", "MIGRATIONS_DATABASE_URI"))
    scratch = create_app(make_test_config(SQLALCHEMY_DATABASE_URI=app_url,
                                          MIGRATIONS_DATABASE_URI=owner_url))
    try:
        yield scratch
    finally:
        with scratch.app_context():
            db.engine.dispose()
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


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
                                     "WHERE indexname = 'ix_memory_chunks_embedding_ann'"))
            # Partial: only the rows of users large enough to need it pay its upkeep.
            assert "hnsw" in index and "vector_cosine_ops" in index and "WHERE ann" in index
            assert conn.scalar(text("SELECT count(*) FROM pg_indexes WHERE indexdef "
                                    "LIKE '%hnsw%'")) == 1
            assert conn.scalar(text("SELECT count(*) FROM plans WHERE is_default")) == 1
            triggers = conn.scalars(text(
                "SELECT tgname FROM pg_trigger WHERE tgrelid = 'audit_events'::regclass "
                "AND NOT tgisinternal ORDER BY tgname")).all()
            assert triggers == ["audit_events_no_truncate", "audit_events_no_update_delete"]
            # The app role was granted what it needs, as the last step of the upgrade.
            assert conn.scalar(text("SELECT count(*) FROM plans")) == 1
        db.engine.dispose()

        downgrade(revision="base")
        inspector = inspect(db.engine)
        assert set(inspector.get_table_names()) <= {"alembic_version"}
        with db.engine.connect() as conn:
            functions = conn.scalar(text(
                "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
                "WHERE n.nspname = 'public' AND p.prolang = "
                "(SELECT oid FROM pg_language WHERE lanname = 'plpgsql')"))
            assert functions == 0
            # The extension was the administrator's (created before the first migration),
            # so it stays for them to remove.
            assert conn.scalar(text("SELECT count(*) FROM pg_extension "
                                    "WHERE extname = 'vector'")) == 1
        db.engine.dispose()

        upgrade()  # and back up again, cleanly
        assert set(inspect(db.engine).get_table_names()) >= EXPECTED_TABLES
        db.engine.dispose()


def test_0006_downgrade_restores_the_full_hnsw_index(scratch_app):
    with scratch_app.app_context():
        upgrade()
        downgrade(revision="0005")
        with db.engine.connect() as conn:
            indexes = dict(conn.execute(text(
                "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'memory_chunks' "
                "AND indexdef LIKE '%hnsw%'")).all())
            assert list(indexes) == ["ix_memory_chunks_embedding_hnsw"]
            assert "WHERE" not in indexes["ix_memory_chunks_embedding_hnsw"]
            assert "ann" not in {c["name"] for c in inspect(conn).get_columns("memory_chunks")}
        upgrade()
        with db.engine.connect() as conn:
            assert conn.scalar(text(
                "SELECT indexname FROM pg_indexes WHERE indexdef LIKE '%hnsw%'")) == \
                "ix_memory_chunks_embedding_ann"
        db.engine.dispose()


def test_0016_marks_ready_the_users_whose_rows_are_all_ann(scratch_app):
    with scratch_app.app_context():
        upgrade(revision="0015")
        with db.engine.begin() as conn:
            users = [conn.scalar(text(
                "INSERT INTO users (email, display_name, password_hash, role) "
                "VALUES (:e, 'u', 'x', 'user') RETURNING id"), {"e": f"u{n}@example.test"})
                for n in range(3)]
            for user_id, flags in zip(users, [(True, True), (True, False), (False, False)],
                                      strict=True):
                conn.execute(text(
                    "INSERT INTO memory_states (user_id, inputs_read_at, snapshot, "
                    "included_keys, embedding_model) VALUES (:u, now(), '1:1:', '{}', 'm')"),
                    {"u": user_id})
                for n, ann in enumerate(flags):
                    conn.execute(text(
                        "INSERT INTO memory_chunks (user_id, source_key, source_id, "
                        "chunk_index, content_hash, content, embedding, embedding_model, ann)"
                        " VALUES (:u, 'xmemo.saved', :s, 0, 'h', 'c', :e, 'm', :a)"),
                        {"u": user_id, "s": str(n), "e": str([0.1] * 384), "a": ann})
        upgrade()
        with db.engine.connect() as conn:
            ready = dict(conn.execute(text("SELECT user_id, ann_ready FROM memory_states")).all())
            # 0023 widened the column: each row padded with zeros, its cosines unchanged.
            widened = conn.scalars(text("SELECT embedding::real[] FROM memory_chunks")).all()
            assert {len(v) for v in widened} == {896}
            assert all(v[:384] == [0.1] * 384 and not any(v[384:]) for v in
                       [[round(x, 6) for x in row] for row in widened])
        assert [ready[u] for u in users] == [True, False, False]
        db.engine.dispose()


def test_models_match_the_migrations(app):
    """Autogenerate against the migrated test database finds nothing to add."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    with app.app_context(), db.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), db.metadata)
    assert diff == []
