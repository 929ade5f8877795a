"""Connected apps: OAuth clients, grants (a user's connection to a client), one-time
codes and tokens (SHA-256 hashes only), and the access log. Memories saved through an
app name it: ``claude`` and ``connector`` join the sources, ``client_name`` the app.
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None

OLD_SOURCES = "('chatgpt', 'codex', 'copilot', 'api', 'orbitpilot')"
NEW_SOURCES = "('chatgpt', 'claude', 'codex', 'copilot', 'api', 'orbitpilot', 'connector')"


def upgrade():
    op.create_table(
        'oauth_clients',
        sa.Column('id', sa.BigInteger(), nullable=False),
        sa.Column('client_id', sa.String(length=2048), nullable=False),
        sa.Column('kind', sa.String(length=16), nullable=False),
        sa.Column('name', sa.String(length=200), nullable=False),
        sa.Column('redirect_uris', postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column('client_uri', sa.Text(), nullable=True),
        sa.Column('grant_types', postgresql.ARRAY(sa.String(length=32)), nullable=False),
        sa.Column('response_types', postgresql.ARRAY(sa.String(length=32)), nullable=False),
        sa.Column('scope', sa.Text(), nullable=True),
        sa.Column('token_endpoint_auth_method', sa.String(length=32), nullable=False),
        sa.Column('client_secret_hash', sa.String(length=64), nullable=True),
        sa.Column('attribution', sa.String(length=16), nullable=False),
        sa.Column('fetched_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'),
                  nullable=False),
        sa.CheckConstraint("kind IN ('registered', 'document')", name=op.f('ck_oauth_clients_kind')),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_oauth_clients')),
        sa.UniqueConstraint('client_id', name=op.f('uq_oauth_clients_client_id')),
    )
    op.create_table(
        'oauth_grants',
        sa.Column('id', sa.BigInteger(), nullable=False),
        sa.Column('user_id', sa.Integer(), nullable=False),
        sa.Column('client_pk', sa.BigInteger(), nullable=False),
        sa.Column('scopes', postgresql.ARRAY(sa.String(length=32)), nullable=False),
        sa.Column('resource', sa.Text(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'),
                  nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'),
                  nullable=False),
        sa.Column('last_used_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('calls', sa.BigInteger(), server_default='0', nullable=False),
        sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('revoked_by', sa.String(length=16), nullable=True),
        sa.CheckConstraint("revoked_by IS NULL OR revoked_by IN ('user', 'admin', 'reuse', "
                           "'code_reuse')", name=op.f('ck_oauth_grants_revoked_by')),
        sa.ForeignKeyConstraint(['client_pk'], ['oauth_clients.id'],
                                name=op.f('fk_oauth_grants_client_pk_oauth_clients'),
                                ondelete='CASCADE'),
        sa.ForeignKeyConstraint(['user_id'], ['users.id'],
                                name=op.f('fk_oauth_grants_user_id_users'), ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_oauth_grants')),
    )
    op.create_index(op.f('ix_oauth_grants_user_id'), 'oauth_grants', ['user_id'])
    op.create_index(op.f('ix_oauth_grants_client_pk'), 'oauth_grants', ['client_pk'])
    op.create_index('uq_oauth_grants_live', 'oauth_grants', ['user_id', 'client_pk', 'resource'],
                    unique=True, postgresql_where=sa.text('revoked_at IS NULL'))
    op.create_table(
        'oauth_codes',
        sa.Column('id', sa.BigInteger(), nullable=False),
        sa.Column('code_hash', sa.String(length=64), nullable=False),
        sa.Column('grant_id', sa.BigInteger(), nullable=False),
        sa.Column('redirect_uri', sa.Text(), nullable=False),
        sa.Column('scopes', postgresql.ARRAY(sa.String(length=32)), nullable=False),
        sa.Column('resource', sa.Text(), nullable=False),
        sa.Column('code_challenge', sa.String(length=128), nullable=False),
        sa.Column('code_challenge_method', sa.String(length=8), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'),
                  nullable=False),
        sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('used_at', sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(['grant_id'], ['oauth_grants.id'],
                                name=op.f('fk_oauth_codes_grant_id_oauth_grants'),
                                ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_oauth_codes')),
        sa.UniqueConstraint('code_hash', name=op.f('uq_oauth_codes_code_hash')),
    )
    op.create_index(op.f('ix_oauth_codes_grant_id'), 'oauth_codes', ['grant_id'])
    op.create_table(
        'oauth_tokens',
        sa.Column('id', sa.BigInteger(), nullable=False),
        sa.Column('grant_id', sa.BigInteger(), nullable=False),
        sa.Column('parent_id', sa.BigInteger(), nullable=True),
        sa.Column('access_hash', sa.String(length=64), nullable=False),
        sa.Column('refresh_hash', sa.String(length=64), nullable=True),
        sa.Column('scopes', postgresql.ARRAY(sa.String(length=32)), nullable=False),
        sa.Column('resource', sa.Text(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'),
                  nullable=False),
        sa.Column('access_expires_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('refresh_expires_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('rotated_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(['grant_id'], ['oauth_grants.id'],
                                name=op.f('fk_oauth_tokens_grant_id_oauth_grants'),
                                ondelete='CASCADE'),
        sa.ForeignKeyConstraint(['parent_id'], ['oauth_tokens.id'],
                                name=op.f('fk_oauth_tokens_parent_id_oauth_tokens'),
                                ondelete='SET NULL'),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_oauth_tokens')),
        sa.UniqueConstraint('access_hash', name=op.f('uq_oauth_tokens_access_hash')),
        sa.UniqueConstraint('refresh_hash', name=op.f('uq_oauth_tokens_refresh_hash')),
    )
    op.create_index(op.f('ix_oauth_tokens_grant_id'), 'oauth_tokens', ['grant_id'])
    op.create_table(
        'connector_access',
        sa.Column('id', sa.BigInteger(), nullable=False),
        sa.Column('grant_id', sa.BigInteger(), nullable=False),
        sa.Column('tool', sa.String(length=32), nullable=False),
        sa.Column('source_key', sa.String(length=64), nullable=False),
        sa.Column('memory_id', sa.UUID(), nullable=True),
        sa.Column('source_id', sa.String(length=200), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'),
                  nullable=False),
        sa.ForeignKeyConstraint(['grant_id'], ['oauth_grants.id'],
                                name=op.f('fk_connector_access_grant_id_oauth_grants'),
                                ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_connector_access')),
    )
    op.create_index('ix_connector_access_grant_id_id', 'connector_access', ['grant_id', 'id'])
    op.add_column('memories', sa.Column('client_name', sa.String(length=200), nullable=True))
    op.drop_constraint(op.f('ck_memories_source'), 'memories', type_='check')
    op.create_check_constraint(op.f('ck_memories_source'), 'memories', f"source IN {NEW_SOURCES}")


def downgrade():
    op.drop_constraint(op.f('ck_memories_source'), 'memories', type_='check')
    op.execute("UPDATE memories SET source = 'api' WHERE source IN ('claude', 'connector')")
    op.create_check_constraint(op.f('ck_memories_source'), 'memories', f"source IN {OLD_SOURCES}")
    op.drop_column('memories', 'client_name')
    op.drop_table('connector_access')
    op.drop_table('oauth_tokens')
    op.drop_table('oauth_codes')
    op.drop_index('uq_oauth_grants_live', table_name='oauth_grants')
    op.drop_table('oauth_grants')
    op.drop_table('oauth_clients')
