"""Whose memory a reply drew on: a "Drew on" record names the owner of the chunk it was
handed (the person's own, or one of their teams'), so an erasure of a team's memory finds
the records and replies of every member who drew on it. Filled in for the records before,
which were all of the person's own memory."""
import sqlalchemy as sa
from alembic import op

revision = '0021'
down_revision = '0020'
branch_labels = None
depends_on = None


def upgrade():
    op.add_column('reply_recalls', sa.Column('owner_id', sa.Integer(), nullable=True))
    op.execute("UPDATE reply_recalls SET owner_id = user_id")
    op.alter_column('reply_recalls', 'owner_id', existing_type=sa.Integer(), nullable=False)
    op.create_foreign_key(op.f('fk_reply_recalls_owner_id_users'), 'reply_recalls', 'users',
                          ['owner_id'], ['id'], ondelete='CASCADE')
    op.create_index('ix_reply_recalls_owner_id_source', 'reply_recalls',
                    ['owner_id', 'source_key', 'source_id'])


def downgrade():
    op.drop_index('ix_reply_recalls_owner_id_source', table_name='reply_recalls')
    op.drop_constraint(op.f('fk_reply_recalls_owner_id_users'), 'reply_recalls',
                       type_='foreignkey')
    op.drop_column('reply_recalls', 'owner_id')
