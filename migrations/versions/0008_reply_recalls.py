"""What a reply drew on: the memory chunks each assistant reply was handed (ids and the
distance, no text), shown under the reply."""
import sqlalchemy as sa
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade():
    op.create_table(
        'reply_recalls',
        sa.Column('id', sa.BigInteger(), nullable=False),
        sa.Column('message_id', sa.Integer(), nullable=False),
        sa.Column('user_id', sa.Integer(), nullable=False),
        sa.Column('rank', sa.Integer(), nullable=False),
        sa.Column('source_key', sa.String(length=64), nullable=False),
        sa.Column('source_id', sa.String(length=128), nullable=False),
        sa.Column('chunk_id', sa.BigInteger(), nullable=False),
        sa.Column('distance', sa.Float(), nullable=False),
        sa.Column('not_relevant', sa.Boolean(), server_default='false', nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'),
                  nullable=False),
        sa.ForeignKeyConstraint(['message_id'], ['messages.id'],
                                name=op.f('fk_reply_recalls_message_id_messages'),
                                ondelete='CASCADE'),
        sa.ForeignKeyConstraint(['user_id'], ['users.id'],
                                name=op.f('fk_reply_recalls_user_id_users'), ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_reply_recalls')),
        sa.UniqueConstraint('message_id', 'rank', name=op.f('uq_reply_recalls_message_id_rank')),
    )
    op.create_index('ix_reply_recalls_user_id_source', 'reply_recalls',
                    ['user_id', 'source_key', 'source_id'])


def downgrade():
    op.drop_table('reply_recalls')
