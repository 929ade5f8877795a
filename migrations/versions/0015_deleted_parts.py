"""The dry run costs what changed: a deleted conversation leaves a tombstone
(``deleted_parts``: its owner, its id, the deleting transaction), so a build or a dry run
finds the chunks of deleted conversations without reading every chat chunk; two partial
indexes reach a user's chat chunks by conversation and by record time. Chunks of
conversations deleted before this migration get their tombstones here."""
import sqlalchemy as sa
from alembic import op

revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None

CHAT = "orbitpilot.chat_history"
PART = "(split_part(source_id, ':', 1)::integer)"

TRIGGER = f"""
CREATE FUNCTION conversations_tombstone() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO deleted_parts (source_key, user_id, part_id, xid)
    SELECT '{CHAT}', g.user_id, g.id, pg_current_xact_id()::text::bigint FROM gone_rows AS g
    -- Not for a user being deleted (the conversations go with the account).
    WHERE EXISTS (SELECT 1 FROM users AS u WHERE u.id = g.user_id);
    RETURN NULL;
END;
$$;
CREATE TRIGGER conversations_tombstone AFTER DELETE ON conversations
    REFERENCING OLD TABLE AS gone_rows
    FOR EACH STATEMENT EXECUTE FUNCTION conversations_tombstone();
"""

BACKFILL = f"""
INSERT INTO deleted_parts (source_key, user_id, part_id, xid)
SELECT DISTINCT '{CHAT}', c.user_id, {PART}, pg_current_xact_id()::text::bigint
FROM memory_chunks AS c
WHERE c.source_key = '{CHAT}'
  AND NOT EXISTS (SELECT 1 FROM conversations AS v WHERE v.id = {PART})
"""


def upgrade():
    op.create_table(
        'deleted_parts',
        sa.Column('id', sa.BigInteger(), nullable=False),
        sa.Column('source_key', sa.String(length=64), nullable=False),
        sa.Column('user_id', sa.Integer(), nullable=False),
        sa.Column('part_id', sa.Integer(), nullable=False),
        sa.Column('xid', sa.BigInteger(), nullable=False),
        sa.Column('deleted_at', sa.DateTime(timezone=True),
                  server_default=sa.text('clock_timestamp()'), nullable=False),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_deleted_parts')),
    )
    op.create_index('ix_deleted_parts_user_id_xid', 'deleted_parts', ['user_id', 'xid'])
    op.execute(TRIGGER)
    op.execute(BACKFILL)
    op.create_index('ix_memory_chunks_chat_part', 'memory_chunks',
                    ['user_id', sa.text(PART)],
                    postgresql_where=sa.text(f"source_key = '{CHAT}'"))
    op.create_index('ix_memory_chunks_chat_record_at', 'memory_chunks',
                    ['user_id', 'record_at'],
                    postgresql_where=sa.text(f"source_key = '{CHAT}'"))


def downgrade():
    op.drop_index('ix_memory_chunks_chat_record_at', table_name='memory_chunks')
    op.drop_index('ix_memory_chunks_chat_part', table_name='memory_chunks')
    op.execute("DROP TRIGGER IF EXISTS conversations_tombstone ON conversations")
    op.execute("DROP FUNCTION IF EXISTS conversations_tombstone()")
    op.drop_index('ix_deleted_parts_user_id_xid', table_name='deleted_parts')
    op.drop_table('deleted_parts')
