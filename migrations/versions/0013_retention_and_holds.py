"""Retention and legal holds: each chunk's record time (filled in for the chunks already
stored), a plan's retention windows and restore window, the ``retention`` build trigger,
legal holds, and erasures pending a hold."""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None

OLD_TRIGGERS = ("('conversation_end', 'conversation_idle', 'user', 'admin', 'schedule', "
                "'system', 'content_change', 'plan_change', 'model_change', 'repair')")
NEW_TRIGGERS = OLD_TRIGGERS[:-1] + ", 'retention')"

# A chat pair's time is its question's: the pair_index-th user turn of the conversation.
_BACKFILL_CHAT = """
UPDATE memory_chunks AS c SET record_at = t.created_at
FROM (SELECT conversation_id, created_at,
             row_number() OVER (PARTITION BY conversation_id ORDER BY position) - 1 AS n
      FROM messages WHERE role = 'user') AS t
WHERE c.source_key = 'orbitpilot.chat_history'
  AND c.source_id = t.conversation_id::text || ':' || t.n::text
"""
_BACKFILL_BY_ID = """
UPDATE memory_chunks AS c SET record_at = r.created_at FROM {table} AS r
WHERE c.source_key = '{key}' AND c.source_id = r.id::text
"""


def upgrade():
    op.add_column('memory_chunks', sa.Column('record_at', sa.DateTime(timezone=True),
                                             nullable=True))
    op.execute(_BACKFILL_CHAT)
    for table, key in (('blinks', 'blink.blinks'), ('memories', 'xmemo.saved'),
                       ('documents', 'docs.documents')):
        op.execute(_BACKFILL_BY_ID.format(table=table, key=key))
    op.add_column('plans', sa.Column('retention', postgresql.JSONB(astext_type=sa.Text()),
                                     server_default=sa.text("'{}'::jsonb"), nullable=False))
    op.add_column('plans', sa.Column('restore_window_days', sa.Integer(), server_default='30',
                                     nullable=False))
    op.create_check_constraint(op.f('ck_plans_restore_window_positive'), 'plans',
                               'restore_window_days >= 1')
    op.drop_constraint(op.f('ck_memory_builds_trigger'), 'memory_builds', type_='check')
    op.create_check_constraint(op.f('ck_memory_builds_trigger'), 'memory_builds',
                               f"trigger IN {NEW_TRIGGERS}")
    op.create_table(
        'legal_holds',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('user_id', sa.Integer(), nullable=False),
        sa.Column('reason', sa.String(length=500), nullable=False),
        sa.Column('placed_by_id', sa.Integer(), nullable=True),
        sa.Column('placed_at', sa.DateTime(timezone=True), server_default=sa.text('now()'),
                  nullable=False),
        sa.Column('ends_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('released_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('released_by_id', sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(['user_id'], ['users.id'],
                                name=op.f('fk_legal_holds_user_id_users'), ondelete='CASCADE'),
        sa.ForeignKeyConstraint(['placed_by_id'], ['users.id'],
                                name=op.f('fk_legal_holds_placed_by_id_users'),
                                ondelete='SET NULL'),
        sa.ForeignKeyConstraint(['released_by_id'], ['users.id'],
                                name=op.f('fk_legal_holds_released_by_id_users'),
                                ondelete='SET NULL'),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_legal_holds')),
    )
    op.create_index('uq_legal_holds_one_open', 'legal_holds', ['user_id'], unique=True,
                    postgresql_where=sa.text('released_at IS NULL'))
    op.add_column('forget_markers', sa.Column('pending_hold', sa.Boolean(),
                                              server_default=sa.false(), nullable=False))
    op.add_column('forget_markers', sa.Column('completed_by_id', sa.BigInteger(),
                                              nullable=True))
    op.create_index('ix_forget_markers_pending_hold', 'forget_markers', ['owner_id'],
                    postgresql_where=sa.text('pending_hold AND completed_by_id IS NULL'))


def downgrade():
    op.drop_index('ix_forget_markers_pending_hold', table_name='forget_markers')
    op.drop_column('forget_markers', 'completed_by_id')
    op.drop_column('forget_markers', 'pending_hold')
    op.drop_index('uq_legal_holds_one_open', table_name='legal_holds')
    op.drop_table('legal_holds')
    op.execute("UPDATE memory_builds SET trigger = 'system' WHERE trigger = 'retention'")
    op.drop_constraint(op.f('ck_memory_builds_trigger'), 'memory_builds', type_='check')
    op.create_check_constraint(op.f('ck_memory_builds_trigger'), 'memory_builds',
                               f"trigger IN {OLD_TRIGGERS}")
    op.drop_constraint(op.f('ck_plans_restore_window_positive'), 'plans', type_='check')
    op.drop_column('plans', 'restore_window_days')
    op.drop_column('plans', 'retention')
    op.drop_column('memory_chunks', 'record_at')
