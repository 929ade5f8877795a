"""Initial schema: the whole product, pgvector, and the append-only audit log.

Revision ID: 0001
Revises: 
Create Date: 2026-11-30 08:00:51.964660

"""
from alembic import op
import sqlalchemy as sa
import pgvector.sqlalchemy
from sqlalchemy.dialects import postgresql

# revision identifiers, used by Alembic.
revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


AUDIT_GUARD = """
CREATE FUNCTION audit_events_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_events is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$;
CREATE TRIGGER audit_events_no_update_delete
    BEFORE UPDATE OR DELETE ON audit_events
    FOR EACH ROW EXECUTE FUNCTION audit_events_refuse_change();
CREATE TRIGGER audit_events_no_truncate
    BEFORE TRUNCATE ON audit_events
    FOR EACH STATEMENT EXECUTE FUNCTION audit_events_refuse_change();
"""


def upgrade():
    op.execute("CREATE EXTENSION IF NOT EXISTS vector")
    op.create_table('audit_checkpoints',
    sa.Column('id', sa.BigInteger(), nullable=False),
    sa.Column('seq', sa.BigInteger(), nullable=False),
    sa.Column('hash', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_audit_checkpoints')),
    sa.UniqueConstraint('seq', name=op.f('uq_audit_checkpoints_seq'))
    )
    op.create_table('audit_events',
    sa.Column('id', sa.BigInteger(), nullable=False),
    sa.Column('seq', sa.BigInteger(), nullable=False),
    sa.Column('occurred_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('action', sa.String(length=64), nullable=False),
    sa.Column('actor_type', sa.String(length=16), nullable=False),
    sa.Column('actor_id', sa.String(length=64), nullable=True),
    sa.Column('owner_id', sa.BigInteger(), nullable=True),
    sa.Column('target_type', sa.String(length=32), nullable=True),
    sa.Column('target_id', sa.String(length=64), nullable=True),
    sa.Column('mode', sa.String(length=16), nullable=True),
    sa.Column('details', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('prev_hash', sa.String(length=64), nullable=False),
    sa.Column('hash', sa.String(length=64), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_audit_events')),
    sa.UniqueConstraint('hash', name=op.f('uq_audit_events_hash')),
    sa.UniqueConstraint('seq', name=op.f('uq_audit_events_seq'))
    )
    with op.batch_alter_table('audit_events', schema=None) as batch_op:
        batch_op.create_index('ix_audit_events_action_occurred_at', ['action', 'occurred_at'], unique=False)
        batch_op.create_index('ix_audit_events_actor', ['actor_type', 'actor_id'], unique=False)
        batch_op.create_index('ix_audit_events_owner_id_occurred_at', ['owner_id', 'occurred_at'], unique=False)

    op.create_table('plans',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=80), nullable=False),
    sa.Column('slug', sa.String(length=80), nullable=False),
    sa.Column('description', sa.Text(), server_default='', nullable=False),
    sa.Column('included_sources', sa.Integer(), server_default='3', nullable=False),
    sa.Column('monthly_price_cents', sa.Integer(), server_default='0', nullable=False),
    sa.Column('is_default', sa.Boolean(), server_default='false', nullable=False),
    sa.Column('active', sa.Boolean(), server_default='true', nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint('included_sources >= 0', name=op.f('ck_plans_included_sources_non_negative')),
    sa.CheckConstraint('monthly_price_cents >= 0', name=op.f('ck_plans_price_non_negative')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_plans')),
    sa.UniqueConstraint('name', name=op.f('uq_plans_name')),
    sa.UniqueConstraint('slug', name=op.f('uq_plans_slug'))
    )
    with op.batch_alter_table('plans', schema=None) as batch_op:
        batch_op.create_index('uq_plans_single_default', ['is_default'], unique=True, postgresql_where=sa.text('is_default'))

    op.create_table('users',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('email', sa.String(length=254), nullable=False),
    sa.Column('display_name', sa.String(length=120), nullable=False),
    sa.Column('password_hash', sa.String(length=255), nullable=False),
    sa.Column('role', sa.String(length=16), server_default='user', nullable=False),
    sa.Column('plan_id', sa.Integer(), nullable=True),
    sa.Column('active', sa.Boolean(), server_default='true', nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('last_login_at', sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("role IN ('user', 'support', 'admin')", name=op.f('ck_users_role')),
    sa.ForeignKeyConstraint(['plan_id'], ['plans.id'], name=op.f('fk_users_plan_id_plans'), ondelete='SET NULL'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_users')),
    sa.UniqueConstraint('email', name=op.f('uq_users_email'))
    )
    with op.batch_alter_table('users', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_users_plan_id'), ['plan_id'], unique=False)

    op.create_table('api_keys',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('owner_id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=100), nullable=False),
    sa.Column('prefix', sa.String(length=16), nullable=False),
    sa.Column('key_hash', sa.String(length=128), nullable=False),
    sa.Column('scopes', postgresql.ARRAY(sa.String(length=32)), nullable=False),
    sa.Column('created_by_id', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('last_used_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['created_by_id'], ['users.id'], name=op.f('fk_api_keys_created_by_id_users'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['owner_id'], ['users.id'], name=op.f('fk_api_keys_owner_id_users'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_api_keys')),
    sa.UniqueConstraint('prefix', name=op.f('uq_api_keys_prefix'))
    )
    with op.batch_alter_table('api_keys', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_api_keys_owner_id'), ['owner_id'], unique=False)

    op.create_table('blinks',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('user_id', sa.Integer(), nullable=False),
    sa.Column('title', sa.String(length=200), server_default='', nullable=False),
    sa.Column('content', sa.Text(), nullable=False),
    sa.Column('excluded_from_memory', sa.Boolean(), server_default='false', nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['user_id'], ['users.id'], name=op.f('fk_blinks_user_id_users'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_blinks'))
    )
    with op.batch_alter_table('blinks', schema=None) as batch_op:
        batch_op.create_index('ix_blinks_user_id_excluded', ['user_id', 'excluded_from_memory'], unique=False)

    op.create_table('conversations',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('user_id', sa.Integer(), nullable=False),
    sa.Column('title', sa.String(length=200), server_default='', nullable=False),
    sa.Column('status', sa.String(length=8), server_default='open', nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('last_activity_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('ended_at', sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("status IN ('open', 'ended')", name=op.f('ck_conversations_status')),
    sa.ForeignKeyConstraint(['user_id'], ['users.id'], name=op.f('fk_conversations_user_id_users'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_conversations'))
    )
    with op.batch_alter_table('conversations', schema=None) as batch_op:
        batch_op.create_index('ix_conversations_user_id_last_activity_at', ['user_id', 'last_activity_at'], unique=False)

    op.create_table('documents',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('user_id', sa.Integer(), nullable=False),
    sa.Column('title', sa.String(length=200), nullable=False),
    sa.Column('filename', sa.String(length=255), server_default='', nullable=False),
    sa.Column('content_type', sa.String(length=100), server_default='text/plain', nullable=False),
    sa.Column('content', sa.Text(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['user_id'], ['users.id'], name=op.f('fk_documents_user_id_users'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_documents'))
    )
    with op.batch_alter_table('documents', schema=None) as batch_op:
        batch_op.create_index('ix_documents_user_id', ['user_id'], unique=False)

    op.create_table('forget_markers',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('memory_id', sa.UUID(), nullable=False),
    sa.Column('owner_id', sa.Integer(), nullable=False),
    sa.Column('mode', sa.String(length=16), nullable=False),
    sa.Column('reason', sa.String(length=500), server_default='', nullable=False),
    sa.Column('actor_type', sa.String(length=16), nullable=False),
    sa.Column('actor_id', sa.String(length=64), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("mode IN ('soft_delete', 'redact', 'hard_delete', 'restore')", name=op.f('ck_forget_markers_mode')),
    sa.ForeignKeyConstraint(['owner_id'], ['users.id'], name=op.f('fk_forget_markers_owner_id_users'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_forget_markers'))
    )
    with op.batch_alter_table('forget_markers', schema=None) as batch_op:
        batch_op.create_index('ix_forget_markers_memory_id', ['memory_id'], unique=False)
        batch_op.create_index('ix_forget_markers_owner_id_created_at', ['owner_id', 'created_at'], unique=False)

    op.create_table('memory_builds',
    sa.Column('id', sa.BigInteger(), nullable=False),
    sa.Column('user_id', sa.Integer(), nullable=False),
    sa.Column('mode', sa.String(length=8), nullable=False),
    sa.Column('trigger', sa.String(length=24), nullable=False),
    sa.Column('status', sa.String(length=12), server_default='queued', nullable=False),
    sa.Column('requested_by_id', sa.Integer(), nullable=True),
    sa.Column('attempts', sa.Integer(), server_default='0', nullable=False),
    sa.Column('added', sa.Integer(), server_default='0', nullable=False),
    sa.Column('removed', sa.Integer(), server_default='0', nullable=False),
    sa.Column('kept', sa.Integer(), server_default='0', nullable=False),
    sa.Column('embedded', sa.Integer(), server_default='0', nullable=False),
    sa.Column('reused', sa.Integer(), server_default='0', nullable=False),
    sa.Column('source_counts', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('resolution', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('timings', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('embedding_model', sa.String(length=64), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('heartbeat_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("mode IN ('quick', 'full')", name=op.f('ck_memory_builds_mode')),
    sa.CheckConstraint("status IN ('queued', 'running', 'succeeded', 'failed')", name=op.f('ck_memory_builds_status')),
    sa.CheckConstraint("trigger IN ('conversation_end', 'conversation_idle', 'user', 'admin', 'schedule', 'system')", name=op.f('ck_memory_builds_trigger')),
    sa.ForeignKeyConstraint(['requested_by_id'], ['users.id'], name=op.f('fk_memory_builds_requested_by_id_users'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['user_id'], ['users.id'], name=op.f('fk_memory_builds_user_id_users'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_memory_builds'))
    )
    with op.batch_alter_table('memory_builds', schema=None) as batch_op:
        batch_op.create_index('ix_memory_builds_status_heartbeat', ['status', 'heartbeat_at'], unique=False)
        batch_op.create_index('ix_memory_builds_user_id_created_at', ['user_id', 'created_at'], unique=False)
        batch_op.create_index('uq_memory_builds_one_queued', ['user_id'], unique=True, postgresql_where=sa.text("status = 'queued'"))
        batch_op.create_index('uq_memory_builds_one_running', ['user_id'], unique=True, postgresql_where=sa.text("status = 'running'"))

    op.create_table('profile_facts',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('user_id', sa.Integer(), nullable=False),
    sa.Column('key', sa.String(length=64), nullable=False),
    sa.Column('value', sa.Text(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['user_id'], ['users.id'], name=op.f('fk_profile_facts_user_id_users'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_profile_facts')),
    sa.UniqueConstraint('user_id', 'key', name=op.f('uq_profile_facts_user_id_key'))
    )
    op.create_table('source_assignments',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('plan_id', sa.Integer(), nullable=False),
    sa.Column('source_key', sa.String(length=64), nullable=False),
    sa.Column('enabled', sa.Boolean(), nullable=False),
    sa.Column('updated_by_id', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['plan_id'], ['plans.id'], name=op.f('fk_source_assignments_plan_id_plans'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['updated_by_id'], ['users.id'], name=op.f('fk_source_assignments_updated_by_id_users'), ondelete='SET NULL'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_source_assignments')),
    sa.UniqueConstraint('plan_id', 'source_key', name=op.f('uq_source_assignments_plan_id_source_key'))
    )
    op.create_table('memories',
    sa.Column('id', sa.UUID(), server_default=sa.text('gen_random_uuid()'), nullable=False),
    sa.Column('owner_id', sa.Integer(), nullable=False),
    sa.Column('content', sa.Text(), nullable=False),
    sa.Column('metadata', postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'{}'::jsonb"), nullable=False),
    sa.Column('source', sa.String(length=16), server_default='api', nullable=False),
    sa.Column('status', sa.String(length=16), server_default='active', nullable=False),
    sa.Column('version', sa.Integer(), server_default='1', nullable=False),
    sa.Column('api_key_id', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('deleted_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('redacted_at', sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("source IN ('chatgpt', 'codex', 'copilot', 'api', 'orbitpilot')", name=op.f('ck_memories_source')),
    sa.CheckConstraint("status IN ('active', 'deleted', 'redacted')", name=op.f('ck_memories_status')),
    sa.CheckConstraint('version >= 1', name=op.f('ck_memories_version_positive')),
    sa.ForeignKeyConstraint(['api_key_id'], ['api_keys.id'], name=op.f('fk_memories_api_key_id_api_keys'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['owner_id'], ['users.id'], name=op.f('fk_memories_owner_id_users'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_memories'))
    )
    with op.batch_alter_table('memories', schema=None) as batch_op:
        batch_op.create_index('ix_memories_owner_id_status_created_at', ['owner_id', 'status', 'created_at'], unique=False)

    op.create_table('memory_chunks',
    sa.Column('id', sa.BigInteger(), nullable=False),
    sa.Column('user_id', sa.Integer(), nullable=False),
    sa.Column('source_key', sa.String(length=64), nullable=False),
    sa.Column('source_id', sa.String(length=128), nullable=False),
    sa.Column('chunk_index', sa.Integer(), nullable=False),
    sa.Column('content_hash', sa.String(length=64), nullable=False),
    sa.Column('content', sa.Text(), nullable=False),
    sa.Column('embedding', pgvector.sqlalchemy.vector.VECTOR(dim=384), nullable=False),
    sa.Column('embedding_model', sa.String(length=64), nullable=False),
    sa.Column('build_id', sa.BigInteger(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['build_id'], ['memory_builds.id'], name=op.f('fk_memory_chunks_build_id_memory_builds'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['user_id'], ['users.id'], name=op.f('fk_memory_chunks_user_id_users'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_memory_chunks')),
    sa.UniqueConstraint('user_id', 'source_key', 'source_id', 'chunk_index', 'content_hash', name='uq_memory_chunks_key')
    )
    with op.batch_alter_table('memory_chunks', schema=None) as batch_op:
        batch_op.create_index('ix_memory_chunks_embedding_hnsw', ['embedding'], unique=False, postgresql_using='hnsw', postgresql_with={'m': 16, 'ef_construction': 64}, postgresql_ops={'embedding': 'vector_cosine_ops'})
        batch_op.create_index('ix_memory_chunks_user_id_source_key', ['user_id', 'source_key'], unique=False)

    op.create_table('messages',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('conversation_id', sa.Integer(), nullable=False),
    sa.Column('user_id', sa.Integer(), nullable=False),
    sa.Column('role', sa.String(length=16), nullable=False),
    sa.Column('position', sa.Integer(), nullable=False),
    sa.Column('content', sa.Text(), nullable=False),
    sa.Column('not_remembered', sa.Boolean(), server_default='false', nullable=False),
    sa.Column('reply_to_id', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("role = 'assistant' OR reply_to_id IS NULL", name=op.f('ck_messages_reply_on_assistant')),
    sa.CheckConstraint("role = 'user' OR NOT not_remembered", name=op.f('ck_messages_flag_on_user_turns')),
    sa.CheckConstraint("role IN ('user', 'assistant')", name=op.f('ck_messages_role')),
    sa.ForeignKeyConstraint(['conversation_id'], ['conversations.id'], name=op.f('fk_messages_conversation_id_conversations'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['reply_to_id'], ['messages.id'], name=op.f('fk_messages_reply_to_id_messages'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['user_id'], ['users.id'], name=op.f('fk_messages_user_id_users'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_messages')),
    sa.UniqueConstraint('conversation_id', 'position', name=op.f('uq_messages_conversation_id_position'))
    )
    with op.batch_alter_table('messages', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_messages_reply_to_id'), ['reply_to_id'], unique=False)
        batch_op.create_index('ix_messages_user_id_not_remembered', ['user_id', 'not_remembered'], unique=False)

    op.create_table('memory_versions',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('memory_id', sa.UUID(), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('content', sa.Text(), nullable=True),
    sa.Column('metadata', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['memory_id'], ['memories.id'], name=op.f('fk_memory_versions_memory_id_memories'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_memory_versions')),
    sa.UniqueConstraint('memory_id', 'version', name=op.f('uq_memory_versions_memory_id_version'))
    )
    op.execute(AUDIT_GUARD)
    # Every user without a plan is on the default plan; the product needs one from the start.
    op.execute(
        "INSERT INTO plans (name, slug, description, included_sources, is_default) "
        "VALUES ('Free', 'free', 'The plan every new account starts on.', 3, true)"
    )


def downgrade():
    op.execute("DROP TRIGGER IF EXISTS audit_events_no_truncate ON audit_events")
    op.execute("DROP TRIGGER IF EXISTS audit_events_no_update_delete ON audit_events")
    op.execute("DROP FUNCTION IF EXISTS audit_events_refuse_change()")
    op.drop_table('memory_versions')
    with op.batch_alter_table('messages', schema=None) as batch_op:
        batch_op.drop_index('ix_messages_user_id_not_remembered')
        batch_op.drop_index(batch_op.f('ix_messages_reply_to_id'))

    op.drop_table('messages')
    with op.batch_alter_table('memory_chunks', schema=None) as batch_op:
        batch_op.drop_index('ix_memory_chunks_user_id_source_key')
        batch_op.drop_index('ix_memory_chunks_embedding_hnsw', postgresql_using='hnsw', postgresql_with={'m': 16, 'ef_construction': 64}, postgresql_ops={'embedding': 'vector_cosine_ops'})

    op.drop_table('memory_chunks')
    with op.batch_alter_table('memories', schema=None) as batch_op:
        batch_op.drop_index('ix_memories_owner_id_status_created_at')

    op.drop_table('memories')
    op.drop_table('source_assignments')
    op.drop_table('profile_facts')
    with op.batch_alter_table('memory_builds', schema=None) as batch_op:
        batch_op.drop_index('uq_memory_builds_one_running', postgresql_where=sa.text("status = 'running'"))
        batch_op.drop_index('uq_memory_builds_one_queued', postgresql_where=sa.text("status = 'queued'"))
        batch_op.drop_index('ix_memory_builds_user_id_created_at')
        batch_op.drop_index('ix_memory_builds_status_heartbeat')

    op.drop_table('memory_builds')
    with op.batch_alter_table('forget_markers', schema=None) as batch_op:
        batch_op.drop_index('ix_forget_markers_owner_id_created_at')
        batch_op.drop_index('ix_forget_markers_memory_id')

    op.drop_table('forget_markers')
    with op.batch_alter_table('documents', schema=None) as batch_op:
        batch_op.drop_index('ix_documents_user_id')

    op.drop_table('documents')
    with op.batch_alter_table('conversations', schema=None) as batch_op:
        batch_op.drop_index('ix_conversations_user_id_last_activity_at')

    op.drop_table('conversations')
    with op.batch_alter_table('blinks', schema=None) as batch_op:
        batch_op.drop_index('ix_blinks_user_id_excluded')

    op.drop_table('blinks')
    with op.batch_alter_table('api_keys', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_api_keys_owner_id'))

    op.drop_table('api_keys')
    with op.batch_alter_table('users', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_users_plan_id'))

    op.drop_table('users')
    with op.batch_alter_table('plans', schema=None) as batch_op:
        batch_op.drop_index('uq_plans_single_default', postgresql_where=sa.text('is_default'))

    op.drop_table('plans')
    with op.batch_alter_table('audit_events', schema=None) as batch_op:
        batch_op.drop_index('ix_audit_events_owner_id_occurred_at')
        batch_op.drop_index('ix_audit_events_actor')
        batch_op.drop_index('ix_audit_events_action_occurred_at')

    op.drop_table('audit_events')
    op.drop_table('audit_checkpoints')
    # Only if the migrating role owns it: an extension an administrator created first
    # (the embedded default does, as an external set-up would) is theirs to remove.
    op.execute("""
        DO $$ BEGIN
            IF EXISTS (SELECT 1 FROM pg_extension
                        WHERE extname = 'vector' AND pg_has_role(extowner, 'USAGE')) THEN
                DROP EXTENSION vector;
            END IF;
        END $$""")
