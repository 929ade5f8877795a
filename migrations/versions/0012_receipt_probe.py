"""Erasure receipts record a post-delete probe: when an exact count of the owner's chunks
of that memory ran after the delete, and how many rows it found (0, or the receipt says
otherwise)."""
import sqlalchemy as sa
from alembic import op

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade():
    op.add_column('forget_markers', sa.Column('probed_at', sa.DateTime(timezone=True),
                                              nullable=True))
    op.add_column('forget_markers', sa.Column('probe_rows', sa.Integer(), nullable=True))


def downgrade():
    op.drop_column('forget_markers', 'probe_rows')
    op.drop_column('forget_markers', 'probed_at')
