"""A plan change applied in bulk leaves each user a build record of mode ``bulk``: the
chunks of the sources the plan no longer includes deleted for a batch of users at once,
with nothing embedded."""
from alembic import op

revision = '0017'
down_revision = '0016'
branch_labels = None
depends_on = None

OLD_MODES = ('quick', 'full')
NEW_MODES = ('quick', 'full', 'bulk')


def upgrade():
    op.drop_constraint(op.f('ck_memory_builds_mode'), 'memory_builds', type_='check')
    op.create_check_constraint(op.f('ck_memory_builds_mode'), 'memory_builds',
                               f"mode IN {NEW_MODES}")


def downgrade():
    op.execute("UPDATE memory_builds SET mode = 'quick' WHERE mode = 'bulk'")
    op.drop_constraint(op.f('ck_memory_builds_mode'), 'memory_builds', type_='check')
    op.create_check_constraint(op.f('ck_memory_builds_mode'), 'memory_builds',
                               f"mode IN {OLD_MODES}")
