"""What a user's stored chunks reflect, and which conversations changed since.

- memory_states: one row per user, written by every build in the transaction that swaps
  its chunks: when that build read its inputs, the sources it included and the embedding
  model. The Memory Status page's dry run of the next build starts from it.
- conversations.changed_at / changed_xid: stamped by statement triggers whenever any of
  the conversation's messages is inserted, updated or deleted (by any path) with the time
  and the writing transaction, so the dry run re-reads only the conversations a build may
  not have seen: those written by a transaction not finished when it read its inputs.
"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None

# Statement triggers with transition tables: a bulk insert of 10,000 messages stamps each
# conversation once, not 10,000 times. (A trigger with transition tables takes one event.)
# The stamp is the writing transaction's id as well as the time: a build notes the snapshot
# it read its inputs in, and a conversation last written by a transaction that snapshot
# does not see (still running then, however long, or later) may hold what it missed.
# An UPDATE stamps the conversation a message left as well as the one it is in.
STAMPS = """
CREATE FUNCTION conversations_stamp(ids integer[]) RETURNS void LANGUAGE sql AS $$
    UPDATE conversations
       SET changed_at = clock_timestamp(), changed_xid = pg_current_xact_id()::text::bigint
     WHERE id = ANY(ids);
$$;
CREATE FUNCTION conversations_stamp_new() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM conversations_stamp(ARRAY(SELECT DISTINCT conversation_id FROM changed_rows));
    RETURN NULL;
END;
$$;
CREATE FUNCTION conversations_stamp_moved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM conversations_stamp(ARRAY(
        SELECT conversation_id FROM changed_rows
        UNION SELECT conversation_id FROM previous_rows));
    RETURN NULL;
END;
$$;
CREATE TRIGGER messages_stamp_insert AFTER INSERT ON messages
    REFERENCING NEW TABLE AS changed_rows
    FOR EACH STATEMENT EXECUTE FUNCTION conversations_stamp_new();
CREATE TRIGGER messages_stamp_update AFTER UPDATE ON messages
    REFERENCING OLD TABLE AS previous_rows NEW TABLE AS changed_rows
    FOR EACH STATEMENT EXECUTE FUNCTION conversations_stamp_moved();
CREATE TRIGGER messages_stamp_delete AFTER DELETE ON messages
    REFERENCING OLD TABLE AS changed_rows
    FOR EACH STATEMENT EXECUTE FUNCTION conversations_stamp_new();
"""


def upgrade():
    op.add_column('conversations', sa.Column(
        'changed_at', sa.DateTime(timezone=True), server_default=sa.text('clock_timestamp()'),
        nullable=False))
    # 0 for conversations written before this migration: older than any build's xmin
    # from now on (and with no memory state yet, the first dry run compares everything).
    op.add_column('conversations', sa.Column(
        'changed_xid', sa.BigInteger(), server_default=sa.text('0'), nullable=False))
    op.create_index('ix_conversations_user_id_changed_xid', 'conversations',
                    ['user_id', 'changed_xid'])
    op.execute(STAMPS)
    op.create_table(
        'memory_states',
        sa.Column('user_id', sa.Integer(), nullable=False),
        sa.Column('inputs_read_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('snapshot', sa.Text(), nullable=False),
        sa.Column('included_keys', postgresql.ARRAY(sa.String(length=64)), nullable=False),
        sa.Column('embedding_model', sa.String(length=64), nullable=False),
        sa.Column('build_id', sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(['user_id'], ['users.id'],
                                name=op.f('fk_memory_states_user_id_users'),
                                ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('user_id', name=op.f('pk_memory_states')),
    )


def downgrade():
    op.drop_table('memory_states')
    for event in ("insert", "update", "delete"):
        op.execute(f"DROP TRIGGER IF EXISTS messages_stamp_{event} ON messages")
    op.execute("DROP FUNCTION IF EXISTS conversations_stamp_new()")
    op.execute("DROP FUNCTION IF EXISTS conversations_stamp_moved()")
    op.execute("DROP FUNCTION IF EXISTS conversations_stamp(integer[])")
    op.drop_index('ix_conversations_user_id_changed_xid', table_name='conversations')
    op.drop_column('conversations', 'changed_xid')
    op.drop_column('conversations', 'changed_at')
