"""The truth check: its runs (``memory_verifications``, counts only) and the ``repair``
trigger of the builds it asks for."""
import sqlalchemy as sa
from alembic import op

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None

OLD_TRIGGERS = ("('conversation_end', 'conversation_idle', 'user', 'admin', 'schedule', "
                "'system', 'content_change', 'plan_change', 'model_change')")
NEW_TRIGGERS = OLD_TRIGGERS[:-1] + ", 'repair')"


def upgrade():
    op.drop_constraint(op.f('ck_memory_builds_trigger'), 'memory_builds', type_='check')
    op.create_check_constraint(op.f('ck_memory_builds_trigger'), 'memory_builds',
                               f"trigger IN {NEW_TRIGGERS}")
    op.create_table(
        'memory_verifications',
        sa.Column('id', sa.BigInteger(), nullable=False),
        sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('finished_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('users_checked', sa.Integer(), nullable=False),
        sa.Column('users_pending', sa.Integer(), nullable=False),
        sa.Column('chunks_checked', sa.BigInteger(), nullable=False),
        sa.Column('violations', sa.Integer(), nullable=False),
        sa.Column('users_with_violations', sa.Integer(), nullable=False),
        sa.Column('repairs_requested', sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_memory_verifications')),
    )


def downgrade():
    op.drop_table('memory_verifications')
    op.execute("UPDATE memory_builds SET trigger = 'system' WHERE trigger = 'repair'")
    op.drop_constraint(op.f('ck_memory_builds_trigger'), 'memory_builds', type_='check')
    op.create_check_constraint(op.f('ck_memory_builds_trigger'), 'memory_builds',
                               f"trigger IN {OLD_TRIGGERS}")
