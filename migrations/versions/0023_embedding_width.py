"""The embedding column widens from 384 to 896 dimensions for the multilingual default
(Universal Sentence Encoder multilingual v3's 512 beside MiniLM's 384): a narrower
model's rows are padded with zeros, which changes no cosine distance, so every stored
chunk stays valid and is searched as before until a model change re-embeds it. Rewrites
``memory_chunks`` and rebuilds the partial HNSW index: minutes on a large deployment."""
import sqlalchemy as sa
from alembic import op

revision = '0023'
down_revision = '0022'
branch_labels = None
depends_on = None

HNSW = dict(postgresql_using='hnsw', postgresql_with={'m': 16, 'ef_construction': 64},
            postgresql_ops={'embedding': 'vector_cosine_ops'},
            postgresql_where=sa.text('ann'))


def _width(old: int, new: int) -> None:
    op.drop_index('ix_memory_chunks_embedding_ann', table_name='memory_chunks', **HNSW)
    if new > old:
        using = f"(embedding::real[] || array_fill(0::real, ARRAY[{new - old}]))::vector({new})"
    else:  # only rows of a narrower model can go back: their tail is all zeros
        using = f"(embedding::real[])[1:{new}]::vector({new})"
    op.execute(f"ALTER TABLE memory_chunks ALTER COLUMN embedding TYPE vector({new}) "
               f"USING {using}")
    op.create_index('ix_memory_chunks_embedding_ann', 'memory_chunks', ['embedding'],
                    unique=False, **HNSW)


def upgrade():
    _width(384, 896)


def downgrade():
    # A wider model's chunks cannot be narrowed: they go, and their owners' next build
    # embeds them again in the model configured then.
    op.execute("DELETE FROM memory_chunks WHERE embedding_model NOT IN "
               "('all-MiniLM-L6-v2', 'hashing-v1')")
    _width(896, 384)
