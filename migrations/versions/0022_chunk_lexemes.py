"""Hybrid recall: each chunk's words as a tsvector (``lexemes``), generated from its
content with the 'simple' configuration (no stemming, no stop words: any language, and
identifiers such as "BL-422" stay whole), each character of a script written without
spaces (Chinese, Japanese; Hangul, whose particles attach to words) set apart first so
that a Latin name or code inside such text is a word of its own; and a GIN index on it
(docs/architecture/retrieval.md). Adding a stored generated column rewrites the table and
rebuilds its indexes, the partial HNSW one too: minutes on a large deployment."""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0022'
down_revision = '0021'
branch_labels = None
depends_on = None

# As dashboard/memory/models.py spells it (a migration keeps its own copy).
LEXEMES = (r"to_tsvector('simple'::regconfig, regexp_replace(content, "
           r"'([\u1100-\u11ff\u2e80-\u2fdf\u3000-\u303f\u3040-\u30ff\u3100-\u31ff"
           r"\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef"
           r"\U00020000-\U0002ffff])', ' \1 ', 'g'))")


def upgrade():
    op.add_column('memory_chunks', sa.Column(
        'lexemes', postgresql.TSVECTOR(), sa.Computed(LEXEMES, persisted=True), nullable=True))
    op.create_index('ix_memory_chunks_lexemes', 'memory_chunks', ['lexemes'],
                    postgresql_using='gin')


def downgrade():
    op.drop_index('ix_memory_chunks_lexemes', table_name='memory_chunks')
    op.drop_column('memory_chunks', 'lexemes')
