"""HNSW only where it serves recall: ``memory_chunks.ann`` and a partial HNSW index.

A user's chunks are all ``ann`` when the user has at least ANN_MIN_CHUNKS of them (the
build that crosses the threshold flips them, either way); retrieval scans smaller users'
rows exactly (btree on user_id) and needs no HNSW index for them. The index over every
row made each chunk write an HNSW insert (measured ~400-900 rows/s against ~55,000 rows/s
for COPY alone); only the rows of users large enough to need it pay that now.

Rows of users already at the default threshold (50,000) are flagged before the index is
built, so the index is built once in bulk. The next build of each user applies the
configured threshold.
"""
import sqlalchemy as sa
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None

HNSW = dict(postgresql_using='hnsw', postgresql_with={'m': 16, 'ef_construction': 64},
            postgresql_ops={'embedding': 'vector_cosine_ops'})
DEFAULT_ANN_MIN_CHUNKS = 50_000


def upgrade():
    # NOT NULL with a constant default: a catalogue change, no table rewrite.
    op.add_column('memory_chunks', sa.Column('ann', sa.Boolean(), server_default=sa.false(),
                                             nullable=False))
    op.drop_index('ix_memory_chunks_embedding_hnsw', table_name='memory_chunks', **HNSW)
    op.execute(sa.text(
        "UPDATE memory_chunks SET ann = true WHERE user_id IN (SELECT user_id FROM "
        "memory_chunks GROUP BY user_id HAVING count(*) >= :threshold)"
    ).bindparams(threshold=DEFAULT_ANN_MIN_CHUNKS))
    op.create_index('ix_memory_chunks_embedding_ann', 'memory_chunks', ['embedding'],
                    unique=False, postgresql_where=sa.text('ann'), **HNSW)


def downgrade():
    op.drop_index('ix_memory_chunks_embedding_ann', table_name='memory_chunks',
                  postgresql_where=sa.text('ann'), **HNSW)
    op.create_index('ix_memory_chunks_embedding_hnsw', 'memory_chunks', ['embedding'],
                    unique=False, **HNSW)
    op.drop_column('memory_chunks', 'ann')
