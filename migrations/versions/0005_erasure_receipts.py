"""Erasure receipts: what a forget removed, the audit event that records it, and when the
memory tables were vacuumed after it (dead row versions gone from the table and its
indexes). (A memory's chunks are found through uq_memory_chunks_key, which starts with
user_id, source_key, source_id.)
"""
import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('forget_markers', schema=None) as batch_op:
        batch_op.add_column(sa.Column('from_status', sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column('to_status', sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column('removed_versions', sa.Integer(), server_default='0',
                                      nullable=False))
        batch_op.add_column(sa.Column('removed_chunks', sa.Integer(), server_default='0',
                                      nullable=False))
        batch_op.add_column(sa.Column('audit_event_id', sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column('vacuum_due', sa.Boolean(), server_default=sa.false(),
                                      nullable=False))
        batch_op.add_column(sa.Column('vacuumed_at', sa.DateTime(timezone=True),
                                      nullable=True))
        # The maintenance job's question: which erasures wait for a VACUUM?
        batch_op.create_index('ix_forget_markers_vacuum_pending', ['id'], unique=False,
                              postgresql_where=sa.text('vacuum_due AND vacuumed_at IS NULL'))


def downgrade():
    with op.batch_alter_table('forget_markers', schema=None) as batch_op:
        batch_op.drop_index('ix_forget_markers_vacuum_pending')
        for column in ('vacuumed_at', 'vacuum_due', 'audit_event_id', 'removed_chunks',
                       'removed_versions', 'to_status', 'from_status'):
            batch_op.drop_column(column)
