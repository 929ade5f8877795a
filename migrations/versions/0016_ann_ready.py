"""A user's "ann ready" flag (``memory_states.ann_ready``): retrieval takes the HNSW path
only once every row of the user is in the index. Builds no longer move rows into the index
themselves; a job does, in short batches, and sets the flag with its last one. Users whose
rows are all ``ann`` already are ready here."""
import sqlalchemy as sa
from alembic import op

revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None

BACKFILL = """
UPDATE memory_states AS s SET ann_ready = true
WHERE EXISTS (SELECT 1 FROM memory_chunks AS c WHERE c.user_id = s.user_id AND c.ann)
  AND NOT EXISTS (SELECT 1 FROM memory_chunks AS c WHERE c.user_id = s.user_id AND NOT c.ann)
"""


def upgrade():
    op.add_column('memory_states', sa.Column('ann_ready', sa.Boolean(),
                                             server_default=sa.false(), nullable=False))
    op.execute(BACKFILL)


def downgrade():
    op.drop_column('memory_states', 'ann_ready')
