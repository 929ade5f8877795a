"""Support finds a user by the start of an email or of its domain: two btree indexes
with ``text_pattern_ops`` (``email LIKE 'part%'`` and ``split_part(email, '@', 2) LIKE
'part%'`` read them, not every user; the embedded server has no pg_trgm for infixes)."""
from alembic import op

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade():
    op.execute("CREATE INDEX ix_users_email_prefix ON users (email text_pattern_ops)")
    op.execute("CREATE INDEX ix_users_email_domain ON users "
               "((split_part(email, '@', 2)) text_pattern_ops)")


def downgrade():
    op.execute("DROP INDEX IF EXISTS ix_users_email_domain")
    op.execute("DROP INDEX IF EXISTS ix_users_email_prefix")
