"""Every check can fail: each test breaks one condition for real (a grant, a key, the
OAuth server's PKCE, a cut chain, a missing header, a failed drill) and the whole report
then fails exactly that check more than it did before."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from authlib.oauth2.rfc7636 import CodeChallenge
from sqlalchemy import create_engine, text

import dashboard.security
from dashboard.audit.anchors import Anchoring
from dashboard.audit.services import SYSTEM, anchor_head, checkpoint_chain, record_event
from dashboard.connectors.oauth import CodeGrant
from dashboard.evidence import checks
from dashboard.evidence.models import EvidenceDrill
from dashboard.evidence.report import Inputs, build_document
from dashboard.evidence.web import probe_app, signing_key
from tests.factories import make_key, make_team, make_user

DISABLE_GUARD = "ALTER TABLE audit_events DISABLE TRIGGER audit_events_no_update_delete"


def failing(app, session, probes) -> dict[str, dict]:
    inputs = Inputs(config=app.config, probes=probes, key=signing_key(app), embedded=True,
                    commit=None)
    document = build_document(session, inputs, report_id=1)
    return {c["id"]: c for c in document["checks"] if not c["passed"]}


def baseline(app, session, probes, strong_hash) -> set[str]:
    """A deployment with an admin (strong hash) and one anchored event: what still fails
    in a test database is what has never run there (the truth check, a drill)."""
    admin = make_user(session, role="admin")
    admin.password_hash = strong_hash
    record_event(session, action="plan.create", actor=SYSTEM, details={})
    anchor_head(session, Anchoring.from_settings(app.config))
    return set(failing(app, session, probes))


def test_a_healthy_test_deployment_fails_only_what_never_ran(app, db_session, probes,
                                                            strong_hash):
    # Another test of this database may have run the truth check: here it never has (the
    # test's transaction is rolled back).
    db_session.execute(text("DELETE FROM memory_verifications"))
    assert baseline(app, db_session, probes, strong_hash) == {"data.truth_check",
                                                               "data.drill"}


def test_update_granted_to_the_app_on_the_audit_table_fails_that_check(
        app, db_session, probes, strong_hash):
    before = baseline(app, db_session, probes, strong_hash)
    role = db_session.scalar(text("SELECT current_user"))
    owner = create_engine(app.config["MIGRATIONS_DATABASE_URI"])
    try:
        with owner.begin() as conn:
            conn.execute(text(f'GRANT UPDATE ON audit_events TO "{role}"'))
        failed = failing(app, db_session, probes)
    finally:
        with owner.begin() as conn:
            conn.execute(text(f'REVOKE UPDATE ON audit_events FROM "{role}"'))
        owner.dispose()
    assert set(failed) == before | {"data.audit_append_only"}
    measured = failed["data.audit_append_only"]["measured"]
    assert measured["privileges"]["audit_events"]["UPDATE"] is True
    # The guard trigger still refused the UPDATE it made possible: the grant alone fails.
    assert measured["refused"]["audit_events"] == {"UPDATE": True, "DELETE": True,
                                                   "TRUNCATE": True}


def test_a_hard_delete_key_without_expiry_fails_the_key_check(app, db_session, probes,
                                                              strong_hash):
    before = baseline(app, db_session, probes, strong_hash)
    owner = make_user(db_session)
    owner.password_hash = strong_hash
    make_key(db_session, owner, scopes=("memory:read", "memory:hard_delete"),
             expires_at=datetime.now(UTC) + timedelta(days=7))
    assert set(failing(app, db_session, probes)) == before  # one that expires is fine
    make_key(db_session, owner, scopes=("memory:read", "memory:hard_delete"))
    failed = failing(app, db_session, probes)
    assert set(failed) == before | {"access.api_keys"}
    assert failed["access.api_keys"]["measured"]["hard_delete_without_expiry"] == 1


def test_plain_pkce_allowed_by_the_server_fails_the_pkce_check(app, db_session, probes,
                                                               strong_hash, monkeypatch):
    before = baseline(app, db_session, probes, strong_hash)
    # The server reconfigured with Authlib's stock PKCE, which takes "plain".
    server = app.extensions["orbitpilot.oauth"]
    monkeypatch.setattr(server, "_authorization_grants",
                        [(CodeGrant, [CodeChallenge(required=True)])])
    with app.app_context():
        weakened = probe_app(app)
    assert weakened.pkce["plain_refused"] is False
    failed = failing(app, db_session, weakened)
    assert set(failed) == before | {"access.oauth_pkce"}


def test_a_redirect_matched_by_prefix_fails_the_redirect_check(app, db_session, probes,
                                                               strong_hash, monkeypatch):
    from dashboard.connectors.models import OAuthClient

    before = baseline(app, db_session, probes, strong_hash)
    monkeypatch.setattr(OAuthClient, "check_redirect_uri",
                        lambda self, uri: any(uri.startswith(r) for r in self.redirect_uris))
    with app.app_context():
        loose = probe_app(app)
    assert set(failing(app, db_session, loose)) == before | {"access.oauth_redirects"}


def test_a_cut_audit_chain_fails_the_chain_check(app, db_session, owner_session, ctx):
    for n in range(3):
        record_event(owner_session, action="plan.create", actor=SYSTEM, details={"n": n})
    checkpoint_chain(owner_session)
    anchor_head(owner_session, Anchoring.from_settings(app.config))
    assert checks.check_audit_chain(ctx(session=owner_session)).passed
    owner_session.execute(text(DISABLE_GUARD))
    owner_session.execute(text("DELETE FROM audit_events WHERE seq = (SELECT max(seq) "
                               "FROM audit_events)"))
    check = checks.check_audit_chain(ctx(session=owner_session))
    assert check.passed is False
    assert "cut short" in check.summary


def test_a_missing_header_fails_the_header_check(app, db_session, probes, strong_hash,
                                                  monkeypatch):
    before = baseline(app, db_session, probes, strong_hash)
    headers = dict(dashboard.security.FIXED_HEADERS)
    del headers["X-Content-Type-Options"]
    monkeypatch.setattr(dashboard.security, "FIXED_HEADERS", headers)
    with app.app_context():
        bare = probe_app(app)
    failed = failing(app, db_session, bare)
    assert set(failed) == before | {"app.headers"}
    assert failed["app.headers"]["measured"]["missing"] == ["X-Content-Type-Options"]


def test_a_failed_drill_fails_the_drill_checks(app, db_session, probes, strong_hash):
    owner = make_user(db_session)
    owner.password_hash = strong_hash
    team = make_team(db_session, owner, app_policy="allow_list")
    now = datetime.now(UTC)
    steps = [{"step": s, "ok": True} for s in ("save", "recall", "hard_delete", "probe")]
    db_session.add(EvidenceDrill(team_id=team.id, status="ready", ok=True, finished_at=now,
                                 steps=[*steps, {"step": "vacuum", "ok": True},
                                        {"step": "export", "ok": True}]))
    db_session.flush()
    ctx = checks.Context(db_session, app.config, probes)
    assert checks.check_team_drill(ctx, team).passed
    db_session.add(EvidenceDrill(team_id=team.id, status="failed", ok=False, finished_at=now,
                                 steps=[*steps, {"step": "vacuum", "ok": False}]))
    db_session.flush()
    check = checks.check_team_drill(ctx, team)
    assert check.passed is False
    assert check.summary == "The last drill failed at: vacuum."


@pytest.mark.parametrize(("change", "check_id"), [
    ({"csrf_status": 200}, "app.csrf"),
    ({"oversize_status": 200}, "app.limits"),
    ({"mutating_rules": ["DELETE /teams/<slug>"]}, "app.only_post_mutates"),
    ({"limits": {"api": "300 per minute"}}, "access.signin_throttle"),
    ({"cookie": {"name": "session", "httponly": False, "secure": False,
                 "samesite": "Lax"}}, "access.session_cookies"),
    ({"refresh_rotates": False}, "access.oauth_tokens"),
    ({"lifetimes": {"access": 86400, "code": 300, "refresh": 86400}}, "access.oauth_tokens"),
])
def test_each_probe_answer_is_judged(ctx, change, check_id):
    """The judgement of the app's answers: each bad answer fails its check (the answers
    themselves are the running app's, above and in test_report.py)."""
    by_id = {"app.csrf": checks.check_csrf, "app.limits": checks.check_limits,
             "app.only_post_mutates": checks.check_only_post,
             "access.signin_throttle": checks.check_signin_throttle,
             "access.session_cookies": checks.check_session_cookies,
             "access.oauth_tokens": checks.check_oauth_tokens}
    assert by_id[check_id](ctx()).passed is True
    assert by_id[check_id](ctx(**change)).passed is False


def test_the_probes_read_the_running_app(probes, app):
    assert probes.csrf_status == 400
    assert probes.oversize_status == 413
    assert probes.pkce == {"plain_refused": True, "missing_refused": True,
                           "s256_accepted": True}
    assert probes.limits["signin-account"] == app.config["SIGNIN_LIMIT_PER_ACCOUNT"]
    assert probes.limits["api"] == app.config["API_RATE_LIMIT"]
    assert probes.tls_headers["Strict-Transport-Security"].startswith("max-age=")
    assert "Strict-Transport-Security" not in probes.headers
    assert probes.cookie["httponly"] is True and probes.cookie["samesite"] == "Lax"
    assert probes.mutating_rules == []


def test_a_team_whose_apps_are_not_listed_and_a_connection_acts_fails(app, db_session, ctx):
    from tests.factories import make_connection

    owner = make_user(db_session)
    team = make_team(db_session, owner)
    assert checks.check_team_apps(ctx(), team).passed  # "any" app, but none acts for it
    grant, _ = make_connection(db_session, owner)
    grant.team_ids = [team.id]
    db_session.flush()
    assert checks.check_team_apps(ctx(), team).passed is False


def test_a_reused_refresh_token_that_does_not_revoke_fails_the_token_check(
        app, db_session, probes, strong_hash, monkeypatch):
    from dashboard.connectors import services as connectors

    before = baseline(app, db_session, probes, strong_hash)
    check = checks.check_oauth_tokens(checks.Context(db_session, app.config, probes))
    assert check.measured["reuse_probe"] == {"old_refresh_refused": True,
                                             "connection_revoked": True,
                                             "new_refresh_refused_after": True}
    # A server that refuses the reused token but leaves the connection standing.
    monkeypatch.setattr(connectors, "find_refresh", lambda session, raw, client, **kw: None)
    failed = failing(app, db_session, probes)
    assert set(failed) == before | {"access.oauth_tokens"}
    assert failed["access.oauth_tokens"]["measured"]["reuse_probe"]["connection_revoked"] \
        is False
