"""Teams: an account that owns memory as a person does (``users.kind = 'team'``, so every
engine and compliance path serves it unchanged), its members and their roles, its
single-use invitations, its policies; who saved each memory and with which credential
(the person, the API key or the registered app); the teams a key or a connected app may
act for; and a shared memory's provenance."""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0020'
down_revision = '0019'
branch_labels = None
depends_on = None

ROLES = "('owner', 'admin', 'member', 'reader')"


def upgrade():
    op.add_column('users', sa.Column('kind', sa.String(length=8), server_default='person',
                                     nullable=False))
    op.create_check_constraint(op.f('ck_users_kind'), 'users', "kind IN ('person', 'team')")
    op.create_table(
        'teams',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('slug', sa.String(length=40), nullable=False),
        sa.Column('name', sa.String(length=120), nullable=False),
        sa.Column('created_by_id', sa.Integer(), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'),
                  nullable=False),
        sa.Column('write_policy', sa.String(length=16), server_default='members',
                  nullable=False),
        sa.Column('forget_policy', sa.String(length=24), server_default='author_or_admins',
                  nullable=False),
        sa.Column('app_policy', sa.String(length=16), server_default='any', nullable=False),
        sa.Column('max_key_days', sa.Integer(), nullable=True),
        sa.Column('leaver_policy', sa.String(length=8), server_default='keep',
                  nullable=False),
        sa.CheckConstraint("slug ~ '^[a-z0-9][a-z0-9-]{1,38}[a-z0-9]$'",
                           name=op.f('ck_teams_slug')),
        sa.CheckConstraint("write_policy IN ('members', 'admins')",
                           name=op.f('ck_teams_write_policy')),
        sa.CheckConstraint("forget_policy IN ('author_or_admins', 'admins')",
                           name=op.f('ck_teams_forget_policy')),
        sa.CheckConstraint("app_policy IN ('any', 'allow_list', 'approve')",
                           name=op.f('ck_teams_app_policy')),
        sa.CheckConstraint("max_key_days IS NULL OR max_key_days BETWEEN 1 AND 3650",
                           name=op.f('ck_teams_max_key_days')),
        sa.CheckConstraint("leaver_policy IN ('keep', 'erase')",
                           name=op.f('ck_teams_leaver_policy')),
        sa.ForeignKeyConstraint(['id'], ['users.id'], name=op.f('fk_teams_id_users'),
                                ondelete='CASCADE'),
        sa.ForeignKeyConstraint(['created_by_id'], ['users.id'],
                                name=op.f('fk_teams_created_by_id_users'), ondelete='SET NULL'),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_teams')),
        sa.UniqueConstraint('slug', name=op.f('uq_teams_slug')),
    )
    op.create_table(
        'team_members',
        sa.Column('team_id', sa.Integer(), nullable=False),
        sa.Column('user_id', sa.Integer(), nullable=False),
        sa.Column('role', sa.String(length=8), nullable=False),
        sa.Column('joined_at', sa.DateTime(timezone=True), server_default=sa.text('now()'),
                  nullable=False),
        sa.Column('last_active_at', sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(f"role IN {ROLES}", name=op.f('ck_team_members_role')),
        sa.ForeignKeyConstraint(['team_id'], ['teams.id'],
                                name=op.f('fk_team_members_team_id_teams'), ondelete='CASCADE'),
        sa.ForeignKeyConstraint(['user_id'], ['users.id'],
                                name=op.f('fk_team_members_user_id_users'), ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('team_id', 'user_id', name=op.f('pk_team_members')),
    )
    op.create_index('ix_team_members_user_id', 'team_members', ['user_id'])
    op.create_table(
        'team_invitations',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('team_id', sa.Integer(), nullable=False),
        sa.Column('email', sa.String(length=254), nullable=False),
        sa.Column('role', sa.String(length=8), nullable=False),
        sa.Column('token_hash', sa.String(length=64), nullable=False),
        sa.Column('created_by_id', sa.Integer(), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'),
                  nullable=False),
        sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('accepted_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('accepted_by_id', sa.Integer(), nullable=True),
        sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(f"role IN {ROLES}", name=op.f('ck_team_invitations_role')),
        sa.ForeignKeyConstraint(['team_id'], ['teams.id'],
                                name=op.f('fk_team_invitations_team_id_teams'),
                                ondelete='CASCADE'),
        sa.ForeignKeyConstraint(['created_by_id'], ['users.id'],
                                name=op.f('fk_team_invitations_created_by_id_users'),
                                ondelete='SET NULL'),
        sa.ForeignKeyConstraint(['accepted_by_id'], ['users.id'],
                                name=op.f('fk_team_invitations_accepted_by_id_users'),
                                ondelete='SET NULL'),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_team_invitations')),
        sa.UniqueConstraint('token_hash', name=op.f('uq_team_invitations_token_hash')),
    )
    op.create_index('ix_team_invitations_team_id', 'team_invitations', ['team_id'])
    # The apps an "allow-list" team lets act for it, or an admin approved.
    op.create_table(
        'team_apps',
        sa.Column('team_id', sa.Integer(), nullable=False),
        sa.Column('client_pk', sa.BigInteger(), nullable=False),
        sa.Column('approved_by_id', sa.Integer(), nullable=True),
        sa.Column('approved_at', sa.DateTime(timezone=True), server_default=sa.text('now()'),
                  nullable=False),
        sa.ForeignKeyConstraint(['team_id'], ['teams.id'],
                                name=op.f('fk_team_apps_team_id_teams'), ondelete='CASCADE'),
        sa.ForeignKeyConstraint(['client_pk'], ['oauth_clients.id'],
                                name=op.f('fk_team_apps_client_pk_oauth_clients'),
                                ondelete='CASCADE'),
        sa.ForeignKeyConstraint(['approved_by_id'], ['users.id'],
                                name=op.f('fk_team_apps_approved_by_id_users'),
                                ondelete='SET NULL'),
        sa.PrimaryKeyConstraint('team_id', 'client_pk', name=op.f('pk_team_apps')),
    )
    # Who saved a memory, with which credential: the person, the registered app (the key
    # is api_key_id already); a shared copy's original.
    op.add_column('memories', sa.Column('author_id', sa.Integer(), nullable=True))
    op.create_foreign_key(op.f('fk_memories_author_id_users'), 'memories', 'users',
                          ['author_id'], ['id'], ondelete='SET NULL')
    op.add_column('memories', sa.Column('oauth_client_pk', sa.BigInteger(), nullable=True))
    op.create_foreign_key(op.f('fk_memories_oauth_client_pk_oauth_clients'), 'memories',
                          'oauth_clients', ['oauth_client_pk'], ['id'], ondelete='SET NULL')
    op.add_column('memories', sa.Column('shared_from_id', postgresql.UUID(as_uuid=True),
                                        nullable=True))
    op.create_index('ix_memories_owner_id_author_id', 'memories', ['owner_id', 'author_id'])
    # Until now the owner saved every memory: they are its author.
    op.execute("UPDATE memories SET author_id = owner_id")
    op.add_column('api_keys', sa.Column('team_ids', postgresql.ARRAY(sa.Integer()),
                                        server_default='{}', nullable=False))
    op.add_column('oauth_grants', sa.Column('team_ids', postgresql.ARRAY(sa.Integer()),
                                            server_default='{}', nullable=False))


def downgrade():
    op.drop_column('oauth_grants', 'team_ids')
    op.drop_column('api_keys', 'team_ids')
    op.drop_index('ix_memories_owner_id_author_id', table_name='memories')
    op.drop_column('memories', 'shared_from_id')
    op.drop_constraint(op.f('fk_memories_oauth_client_pk_oauth_clients'), 'memories',
                       type_='foreignkey')
    op.drop_column('memories', 'oauth_client_pk')
    op.drop_constraint(op.f('fk_memories_author_id_users'), 'memories', type_='foreignkey')
    op.drop_column('memories', 'author_id')
    op.drop_table('team_apps')
    op.drop_index('ix_team_invitations_team_id', table_name='team_invitations')
    op.drop_table('team_invitations')
    op.drop_index('ix_team_members_user_id', table_name='team_members')
    op.drop_table('team_members')
    op.drop_table('teams')
    op.drop_constraint(op.f('ck_users_kind'), 'users', type_='check')
    op.drop_column('users', 'kind')
