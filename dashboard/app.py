"""The application: defaults, then the environment, then the caller's ``config``; then one
``init_*`` step per concern. ``dashboard.create_app`` builds it."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flask import Flask, request
from flask_admin import Admin
from flask_admin.theme import Bootstrap4Theme
from sqlalchemy import event

import dashboard.catalog  # noqa: F401  (installs the sources, in rank order)
import dashboard.models  # noqa: F401  (the whole schema, for Alembic and relationships)
from dashboard.admin.assignments import AssignmentView
from dashboard.admin.evidence import EvidenceView
from dashboard.admin.home import StaffIndexView
from dashboard.admin.retention import RetentionView
from dashboard.admin.views import (
    ApiKeyView,
    BuildView,
    ConnectionView,
    ForgetMarkerView,
    PlanView,
    UserView,
)
from dashboard.audit.models import AuditEvent
from dashboard.audit.views import AuditEventView
from dashboard.auth.models import User
from dashboard.auth.views import bp as auth_bp
from dashboard.auth.views import load_user, throttle_signin
from dashboard.blinks.views import bp as blinks_bp
from dashboard.cli import register_cli
from dashboard.config import instance_folder, settings_from_env
from dashboard.connectors.mcp_http import init_mcp
from dashboard.connectors.models import OAuthGrant
from dashboard.connectors.views import bp as connectors_bp
from dashboard.connectors.views import init_oauth, limit_oauth
from dashboard.database import normalise_database_url
from dashboard.documents.views import bp as documents_bp
from dashboard.embedded import OWNER_ROLE, EmbeddedBinding, ensure_started, get_services
from dashboard.errors import register_error_handlers
from dashboard.evidence.views import bp as evidence_bp
from dashboard.exports.views import bp as exports_bp
from dashboard.extensions import csrf, db, login_manager, migrate
from dashboard.memory import MemoryBuild
from dashboard.memory.views import bp as memory_bp
from dashboard.metrics import bp as metrics_bp
from dashboard.orbitpilot.profile_pages import bp as profile_bp
from dashboard.orbitpilot.views import bp as orbitpilot_bp
from dashboard.plans.models import Plan
from dashboard.queues import init_queue
from dashboard.retention import web as retention_web
from dashboard.saved_memories.api import init_api
from dashboard.saved_memories.key_pages import bp as keys_bp
from dashboard.saved_memories.models import ApiKey, ForgetMarker
from dashboard.saved_memories.pages import bp as memories_bp
from dashboard.saved_memories.team_pages import bp as team_memories_bp
from dashboard.security import csp_nonce, init_security
from dashboard.sources import registered_sources
from dashboard.staff import without_inline_handlers
from dashboard.support.views import SupportView
from dashboard.teams.pages import bp as teams_bp
from dashboard.views import bp as main_bp

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def build_app(config: Mapping[str, Any] | None = None) -> Flask:
    instance_path = Path(
        (config or {}).get("INSTANCE_PATH") or instance_folder(PROJECT_ROOT / "instance")
    ).resolve()
    instance_path.mkdir(parents=True, exist_ok=True)
    app = Flask(
        "dashboard",
        instance_path=str(instance_path),
        template_folder=str(PROJECT_ROOT / "templates"),
    )
    app.config.update(
        # hide_parameters: SQLAlchemy's exception messages and logs never carry a
        # statement's parameters (content, a password hash). The database's own DETAIL can
        # still quote a row, which is why no page ever shows exception text (errors.py).
        SQLALCHEMY_ENGINE_OPTIONS={"pool_pre_ping": True, "hide_parameters": True,
                                   "connect_args": {"connect_timeout": 5}},
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
        WTF_CSRF_TIME_LIMIT=None,
        FLASK_ADMIN_SWATCH="cerulean",
    )
    app.config.update(settings_from_env(instance_path))
    if config:
        app.config.update(config)

    init_services(app)
    init_extensions(app)
    init_queue(app)
    init_blueprints(app)
    init_mcp(app)  # inside init_security's wrappers: /mcp gets the Host check too
    init_security(app)
    throttle_signin(app)
    limit_oauth(app)
    init_api(app)
    init_admin(app)
    register_cli(app)
    init_templates(app)
    register_error_handlers(app)
    return app


def init_services(app: Flask) -> None:
    """Point at PostgreSQL and Redis: the configured ones, or the embedded default.

    Nothing starts here: the embedded servers start on first use (a connection, a Redis
    client, a request), so commands like ``flask services status`` touch nothing."""
    database_url = app.config.get("SQLALCHEMY_DATABASE_URI") or app.config["DATABASE_URL"]
    owner_url = app.config.get("MIGRATIONS_DATABASE_URI") or app.config["DATABASE_OWNER_URL"] \
        or database_url
    redis_url = app.config["REDIS_URL"]
    if not database_url or not redis_url:
        services = get_services(app.config["EMBEDDED_DIR"])
        urls = services.urls()
        name = app.config["EMBEDDED_DATABASE"]
        app.extensions["orbitpilot.embedded"] = EmbeddedBinding(
            services, postgres=not database_url, redis=not redis_url, database=name)
        if not database_url:
            database_url = urls.database_url(name)
            owner_url = urls.database_url(name, OWNER_ROLE)
        redis_url = redis_url or urls.redis
    app.config["SQLALCHEMY_DATABASE_URI"] = normalise_database_url(database_url)
    app.config["MIGRATIONS_DATABASE_URI"] = normalise_database_url(owner_url)
    app.config["REDIS_URL"] = redis_url


def init_extensions(app: Flask) -> None:
    db.init_app(app)
    migrate.init_app(app, db, directory=str(PROJECT_ROOT / "migrations"))
    _start_embedded_on_first_use(app)
    csrf.init_app(app)
    login_manager.init_app(app)
    login_manager.user_loader(load_user)
    login_manager.login_view = "auth.signin"
    login_manager.login_message = "Please sign in to see that page."
    login_manager.login_message_category = "info"


def _start_embedded_on_first_use(app: Flask) -> None:
    binding = app.extensions.get("orbitpilot.embedded")
    if binding is None:
        return
    if binding.postgres:
        with app.app_context():
            event.listen(db.engine, "do_connect", lambda *args: binding.ensure_postgres())

    def ensure_or_unavailable() -> None:
        # The health check reports an outage itself, as JSON.
        if request.endpoint != "main.healthz":
            ensure_started(app)

    # First of the request hooks: the rate limiter's Redis client needs the server too.
    app.before_request(ensure_or_unavailable)


def init_blueprints(app: Flask) -> None:
    for blueprint in (main_bp, auth_bp, memory_bp, orbitpilot_bp, blinks_bp, profile_bp,
                      documents_bp, keys_bp, memories_bp, connectors_bp, metrics_bp,
                      exports_bp, teams_bp, team_memories_bp, evidence_bp):
        app.register_blueprint(blueprint)
    init_oauth(app)


def init_admin(app: Flask) -> Admin:
    """The staff console: every staff view, registered here, where the app is assembled."""
    admin = Admin(
        app,
        name="OrbitPilot staff",
        url="/admin",
        index_view=StaffIndexView(url="/admin"),
        theme=Bootstrap4Theme(swatch="default", fluid=True),  # the menu fits one line
        csp_nonce_generator=csp_nonce,
    )
    admin.add_view(PlanView(Plan, db, name="Plans"))
    admin.add_view(UserView(User, db, name="Users"))
    admin.add_view(AssignmentView(name="Assignments", endpoint="assignments",
                                  url="/admin/assignments"))
    admin.add_view(ApiKeyView(ApiKey, db, name="API keys", endpoint="api_keys"))
    admin.add_view(ConnectionView(OAuthGrant, db, name="Connected apps",
                                  endpoint="connections"))
    admin.add_view(BuildView(MemoryBuild, db, name="Builds", endpoint="builds"))
    admin.add_view(AuditEventView(AuditEvent, db, name="Audit log", endpoint="audit"))
    admin.add_view(ForgetMarkerView(ForgetMarker, db, name="Erasure markers",
                                    endpoint="markers"))
    admin.add_view(RetentionView(name="Retention", endpoint="retention",
                                 url="/admin/retention"))
    admin.add_view(SupportView(name="Support", endpoint="support", url="/support"))
    admin.add_view(EvidenceView(name="Evidence", endpoint="evidence_admin",
                                url="/admin/evidence"))
    app.after_request(without_inline_handlers)
    return admin


def init_templates(app: Flask) -> None:
    @app.context_processor
    def inject_registry() -> dict[str, Any]:
        return {"SOURCE_REGISTRY": registered_sources()}

    retention_web.init_app(app)
