"""Builds asked for by a change of embedding model: the ``model_change`` trigger."""
from alembic import op

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None

OLD_TRIGGERS = ("('conversation_end', 'conversation_idle', 'user', 'admin', 'schedule', "
                "'system', 'content_change', 'plan_change')")
NEW_TRIGGERS = OLD_TRIGGERS[:-1] + ", 'model_change')"


def upgrade():
    op.drop_constraint(op.f('ck_memory_builds_trigger'), 'memory_builds', type_='check')
    op.create_check_constraint(op.f('ck_memory_builds_trigger'), 'memory_builds',
                               f"trigger IN {NEW_TRIGGERS}")


def downgrade():
    op.execute("UPDATE memory_builds SET trigger = 'system' WHERE trigger = 'model_change'")
    op.drop_constraint(op.f('ck_memory_builds_trigger'), 'memory_builds', type_='check')
    op.create_check_constraint(op.f('ck_memory_builds_trigger'), 'memory_builds',
                               f"trigger IN {OLD_TRIGGERS}")
