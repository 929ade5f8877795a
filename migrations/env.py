import logging
from logging.config import fileConfig

from alembic import context
from flask import current_app
from sqlalchemy import pool

# this is the Alembic Config object, which provides
# access to the values within the .ini file in use.
config = context.config

# Interpret the config file for Python logging.
# This line sets up loggers basically.
# Keep the app's loggers (tests run migrations in-process).
fileConfig(config.config_file_name, disable_existing_loggers=False)
logger = logging.getLogger('alembic.env')


def get_engine():
    """Migrations run as the database's owner (MIGRATIONS_DATABASE_URI), not as the app
    role the web and worker processes use."""
    from sqlalchemy import create_engine

    binding = current_app.extensions.get('orbitpilot.embedded')
    if binding is not None:
        binding.ensure_postgres()
    return create_engine(current_app.config['MIGRATIONS_DATABASE_URI'], poolclass=pool.NullPool,
                         hide_parameters=True)


def get_engine_url():
    return current_app.config['MIGRATIONS_DATABASE_URI'].replace('%', '%%')


# add your model's MetaData object here
# for 'autogenerate' support
# from myapp import mymodel
# target_metadata = mymodel.Base.metadata
config.set_main_option('sqlalchemy.url', get_engine_url())
target_db = current_app.extensions['migrate'].db

# other values from the config, defined by the needs of env.py,
# can be acquired:
# my_important_option = config.get_main_option("my_important_option")
# ... etc.


def get_metadata():
    if hasattr(target_db, 'metadatas'):
        return target_db.metadatas[None]
    return target_db.metadata


def run_migrations_offline():
    """Run migrations in 'offline' mode: with a URL and no Engine, emitting the SQL to the
    script output."""
    url = config.get_main_option("sqlalchemy.url")
    context.configure(
        url=url, target_metadata=get_metadata(), literal_binds=True
    )

    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online():
    """Run migrations in 'online' mode.

    In this scenario we need to create an Engine
    and associate a connection with the context.

    """

    # this callback is used to prevent an auto-migration from being generated
    # when there are no changes to the schema
    # reference: http://alembic.zzzcomputing.com/en/latest/cookbook.html
    def process_revision_directives(context, revision, directives):
        if getattr(config.cmd_opts, 'autogenerate', False):
            script = directives[0]
            if script.upgrade_ops.is_empty():
                directives[:] = []
                logger.info('No changes in schema detected.')

    conf_args = current_app.extensions['migrate'].configure_args
    if conf_args.get("process_revision_directives") is None:
        conf_args["process_revision_directives"] = process_revision_directives

    from dashboard.database import app_role_for, grant_app_privileges

    connectable = get_engine()
    app_role = app_role_for(current_app.config['SQLALCHEMY_DATABASE_URI'],
                            current_app.config['MIGRATIONS_DATABASE_URI'])

    with connectable.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=get_metadata(),
            **conf_args
        )

        with context.begin_transaction():
            context.run_migrations()
            # In the same transaction: the schema and the app role's reach change together.
            if app_role and connection.dialect.has_table(connection, 'alembic_version'):
                grant_app_privileges(connection, app_role)
    connectable.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
