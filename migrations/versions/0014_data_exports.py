"""Download everything about me: the exports and the pieces of their zips."""
import sqlalchemy as sa
from alembic import op

revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None

STATUSES = "('queued', 'running', 'ready', 'failed', 'expired')"


def upgrade():
    op.create_table(
        'data_exports',
        sa.Column('id', sa.BigInteger(), nullable=False),
        sa.Column('user_id', sa.Integer(), nullable=False),
        sa.Column('status', sa.String(length=8), server_default='queued', nullable=False),
        sa.Column('progress', sa.Integer(), server_default='0', nullable=False),
        sa.Column('stage', sa.String(length=32), server_default='', nullable=False),
        sa.Column('size_bytes', sa.BigInteger(), server_default='0', nullable=False),
        sa.Column('error', sa.String(length=64), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'),
                  nullable=False),
        sa.Column('heartbeat_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('expires_at', sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(f'status IN {STATUSES}', name=op.f('ck_data_exports_status')),
        sa.CheckConstraint('progress BETWEEN 0 AND 100',
                           name=op.f('ck_data_exports_progress_range')),
        sa.ForeignKeyConstraint(['user_id'], ['users.id'],
                                name=op.f('fk_data_exports_user_id_users'), ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_data_exports')),
    )
    op.create_index('ix_data_exports_user_id_created_at', 'data_exports',
                    ['user_id', 'created_at'])
    op.create_index('uq_data_exports_one_pending', 'data_exports', ['user_id'], unique=True,
                    postgresql_where=sa.text("status IN ('queued', 'running')"))
    op.create_table(
        'data_export_parts',
        sa.Column('export_id', sa.BigInteger(), nullable=False),
        sa.Column('seq', sa.Integer(), nullable=False),
        sa.Column('data', sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(['export_id'], ['data_exports.id'],
                                name=op.f('fk_data_export_parts_export_id_data_exports'),
                                ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('export_id', 'seq', name=op.f('pk_data_export_parts')),
    )


def downgrade():
    op.drop_table('data_export_parts')
    op.drop_index('uq_data_exports_one_pending', table_name='data_exports')
    op.drop_index('ix_data_exports_user_id_created_at', table_name='data_exports')
    op.drop_table('data_exports')
