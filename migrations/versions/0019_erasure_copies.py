"""Erasure reaches the copies, a legal hold keeps what an edit replaces: a receipt's
copies (what a redaction or hard delete changed in chat replies, "Drew on" records and
exports, and what an exact count found left), a reply's own mark that it drew on memory
(filled in from the "Drew on" records), an export withdrawn by a later erasure, and the
versions an edit under a hold replaced."""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0019'
down_revision = '0018'
branch_labels = None
depends_on = None

OLD_STATUSES = "('queued', 'running', 'ready', 'failed', 'expired')"
NEW_STATUSES = "('queued', 'running', 'ready', 'failed', 'expired', 'withdrawn')"


def upgrade():
    op.add_column('forget_markers', sa.Column(
        'copies', postgresql.JSONB(astext_type=sa.Text()), nullable=True))
    op.add_column('messages', sa.Column('drew_on_memory', sa.Boolean(),
                                        server_default='false', nullable=False))
    # The same replies as before are remembered by their question alone.
    op.execute("UPDATE messages AS m SET drew_on_memory = true WHERE EXISTS "
               "(SELECT 1 FROM reply_recalls AS r WHERE r.message_id = m.id)")
    op.alter_column('data_exports', 'status', type_=sa.String(length=16),
                    existing_type=sa.String(length=8), existing_nullable=False,
                    existing_server_default='queued')
    op.drop_constraint(op.f('ck_data_exports_status'), 'data_exports', type_='check')
    op.create_check_constraint(op.f('ck_data_exports_status'), 'data_exports',
                               f'status IN {NEW_STATUSES}')
    op.add_column('data_exports', sa.Column('withdrawn_at', sa.DateTime(timezone=True),
                                            nullable=True))
    op.create_table(
        'held_versions',
        sa.Column('id', sa.BigInteger(), nullable=False),
        sa.Column('user_id', sa.Integer(), nullable=False),
        sa.Column('hold_id', sa.Integer(), nullable=False),
        sa.Column('kind', sa.String(length=16), nullable=False),
        sa.Column('item_id', sa.Integer(), nullable=False),
        sa.Column('title', sa.String(length=200), server_default='', nullable=False),
        sa.Column('content', sa.Text(), nullable=False),
        sa.Column('held_at', sa.DateTime(timezone=True), server_default=sa.text('now()'),
                  nullable=False),
        sa.CheckConstraint("kind IN ('blink', 'profile_fact')",
                           name=op.f('ck_held_versions_kind')),
        sa.ForeignKeyConstraint(['user_id'], ['users.id'],
                                name=op.f('fk_held_versions_user_id_users'),
                                ondelete='CASCADE'),
        sa.ForeignKeyConstraint(['hold_id'], ['legal_holds.id'],
                                name=op.f('fk_held_versions_hold_id_legal_holds'),
                                ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_held_versions')),
    )
    op.create_index('ix_held_versions_user_id_kind_item_id', 'held_versions',
                    ['user_id', 'kind', 'item_id'])
    op.create_index('ix_held_versions_hold_id', 'held_versions', ['hold_id'])


def downgrade():
    op.drop_index('ix_held_versions_hold_id', table_name='held_versions')
    op.drop_index('ix_held_versions_user_id_kind_item_id', table_name='held_versions')
    op.drop_table('held_versions')
    op.drop_column('data_exports', 'withdrawn_at')
    # A withdrawn export's copy is gone, as an expired one's is.
    op.execute("UPDATE data_exports SET status = 'expired' WHERE status = 'withdrawn'")
    op.drop_constraint(op.f('ck_data_exports_status'), 'data_exports', type_='check')
    op.create_check_constraint(op.f('ck_data_exports_status'), 'data_exports',
                               f'status IN {OLD_STATUSES}')
    op.alter_column('data_exports', 'status', type_=sa.String(length=8),
                    existing_type=sa.String(length=16), existing_nullable=False,
                    existing_server_default='queued')
    op.drop_column('messages', 'drew_on_memory')
    op.drop_column('forget_markers', 'copies')
