"""How sure recall was of each item a reply drew on (``reply_recalls.relevance``:
"relevant" or "possibly_related"), so "Drew on" labels what it was not sure of. Records
made before it were all within the old cut: "relevant". A constant default: a catalogue
change, no table rewrite."""
import sqlalchemy as sa
from alembic import op

revision = '0024'
down_revision = '0023'
branch_labels = None
depends_on = None


def upgrade():
    op.add_column('reply_recalls', sa.Column('relevance', sa.String(length=20),
                                             server_default='relevant', nullable=False))


def downgrade():
    op.drop_column('reply_recalls', 'relevance')
