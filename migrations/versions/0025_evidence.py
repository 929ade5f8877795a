"""Evidence for evaluators: signed reports and deletion/export drills
(docs/architecture/evidence.md)."""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0025'
down_revision = '0024'
branch_labels = None
depends_on = None

STATUSES = "('queued', 'running', 'ready', 'failed')"


def _common(table):
    return [
        sa.Column('id', sa.BigInteger(), nullable=False),
        sa.Column('team_id', sa.Integer(), nullable=True),
        sa.Column('requested_by_id', sa.Integer(), nullable=True),
        sa.Column('status', sa.String(length=16), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'),
                  nullable=False),
        sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(f'status IN {STATUSES}', name=op.f(f'ck_{table}_status')),
        sa.ForeignKeyConstraint(['team_id'], ['teams.id'],
                                name=op.f(f'fk_{table}_team_id_teams'), ondelete='CASCADE'),
        sa.ForeignKeyConstraint(['requested_by_id'], ['users.id'],
                                name=op.f(f'fk_{table}_requested_by_id_users'),
                                ondelete='SET NULL'),
        sa.PrimaryKeyConstraint('id', name=op.f(f'pk_{table}')),
    ]


def upgrade():
    op.create_table(
        'evidence_reports', *_common('evidence_reports'),
        sa.Column('progress', sa.Integer(), server_default='0', nullable=False),
        sa.Column('stage', sa.String(length=64), server_default='', nullable=False),
        sa.Column('passed', sa.Integer(), nullable=True),
        sa.Column('failed', sa.Integer(), nullable=True),
        sa.Column('body', sa.LargeBinary(), nullable=True),
        sa.Column('signature', sa.LargeBinary(), nullable=True),
        sa.CheckConstraint('progress BETWEEN 0 AND 100',
                           name=op.f('ck_evidence_reports_progress_range')),
    )
    op.create_index('ix_evidence_reports_team_id_created_at', 'evidence_reports',
                    ['team_id', 'created_at'])
    op.create_table(
        'evidence_drills', *_common('evidence_drills'),
        sa.Column('ok', sa.Boolean(), nullable=True),
        sa.Column('steps', postgresql.JSONB(astext_type=sa.Text()), server_default='[]',
                  nullable=False),
    )
    op.create_index('ix_evidence_drills_team_id_created_at', 'evidence_drills',
                    ['team_id', 'created_at'])


def downgrade():
    op.drop_index('ix_evidence_drills_team_id_created_at', table_name='evidence_drills')
    op.drop_table('evidence_drills')
    op.drop_index('ix_evidence_reports_team_id_created_at', table_name='evidence_reports')
    op.drop_table('evidence_reports')
