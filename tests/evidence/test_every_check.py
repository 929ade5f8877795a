"""Every check can fail. The conditions the issue lists are broken for real in
test_checks.py (and test_drill.py); here each remaining check is shown failing on the
condition it guards, and a last test holds that no check in the table is left out."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import delete

from dashboard.evidence import checks
from dashboard.evidence.controls import BY_ID
from dashboard.memory.models import MemoryVerification
from dashboard.saved_memories.models import ForgetMarker
from dashboard.teams.models import TeamMember
from tests.factories import make_connection, make_key, make_team, make_user

# Broken for real elsewhere: in test_checks.py, test_drill.py and test_pages.py.
BROKEN_ELSEWHERE = {"data.audit_append_only", "access.api_keys", "access.oauth_pkce",
                    "access.oauth_redirects", "data.audit_chain", "app.headers",
                    "team.drill", "data.drill", "access.oauth_tokens", "app.csrf",
                    "app.limits", "app.only_post_mutates", "access.signin_throttle",
                    "access.session_cookies", "team.apps"}


def _marker(session, owner, **fields) -> None:
    session.add(ForgetMarker(memory_id=uuid.uuid4(), owner_id=owner.id, mode="hard_delete",
                             actor_type="system", actor_id="test", version=1, **fields))
    session.flush()


def _hard_delete_app(session, person) -> None:
    """A connection an admin granted hard delete (as ``oauth.grant_hard_delete`` does)."""
    grant, _ = make_connection(session, person)
    grant.scopes = [*grant.scopes, "memory:hard_delete"]
    session.flush()


def _verification(session, violations: int) -> None:
    now = datetime.now(UTC)
    session.add(MemoryVerification(started_at=now, finished_at=now, users_checked=1,
                                   users_pending=0, chunks_checked=1, violations=violations,
                                   users_with_violations=min(violations, 1),
                                   repairs_requested=violations))
    session.flush()


def _run(check_id, ctx, session, *, team=None):
    by_id = {
        "access.passwords": lambda: checks.check_passwords(ctx),
        "access.staff": lambda: checks.check_staff(ctx),
        "access.connected_apps": lambda: checks.check_connected_apps(ctx),
        "data.db_role": lambda: checks.check_db_role(ctx),
        "data.truth_check": lambda: checks.check_truth_check(ctx),
        "data.retention": lambda: checks.check_retention(ctx),
        "data.legal_holds": lambda: checks.check_legal_holds(ctx),
        "data.erasure": lambda: checks.check_erasure(ctx),
        "data.backups": lambda: checks.check_backups(ctx, embedded=False),
        "software.versions": lambda: checks.check_versions(ctx, app_version="x", commit=None),
        "software.sbom": lambda: checks.check_sbom(ctx, {"bomFormat": "CycloneDX",
                                                          "components": [{}]}),
        "team.members": lambda: checks.check_team_members(ctx, team),
        "team.policies": lambda: checks.check_team_policies(ctx, team),
        "team.data_location": lambda: checks.check_team_location(
            ctx, team, where={"database": "orbitpilot", "host": "local socket"}),
    }
    return by_id[check_id]()


def _strong_people(session, strong_hash):
    admin = make_user(session, role="admin")
    admin.password_hash = strong_hash
    lead = make_user(session)
    lead.password_hash = strong_hash
    return admin, lead


BREAKS = {
    # check id: (what breaks it, how)
    "access.passwords": lambda s, c, admin, lead, team: make_user(s),  # PBKDF2, 1,000 rounds
    "access.staff": lambda s, c, admin, lead, team: setattr(admin, "role", "user"),
    "access.connected_apps": lambda s, c, admin, lead, team: _hard_delete_app(s, lead),
    "data.truth_check": lambda s, c, admin, lead, team: _verification(s, 2),
    "data.retention": lambda s, c, admin, lead, team: c.update(RETENTION_SECONDS=0),
    "data.legal_holds": lambda s, c, admin, lead, team: _marker(s, lead, pending_hold=True),
    "data.erasure": lambda s, c, admin, lead, team: _marker(s, lead, probe_rows=1),
    "data.backups": lambda s, c, admin, lead, team: c.update(BACKUP_RETENTION_DAYS=None),
    "software.versions": lambda s, c, admin, lead, team: setattr(checks, "MIN_POSTGRES", 99),
    "team.members": lambda s, c, admin, lead, team: s.execute(
        delete(TeamMember).where(TeamMember.team_id == team.id, TeamMember.role == "owner")),
    "team.policies": lambda s, c, admin, lead, team: make_key(
        s, lead, scopes=("memory:read", "memory:hard_delete"), team_ids=[team.id]),
}


@pytest.mark.parametrize("check_id", sorted(BREAKS))
def test_each_check_fails_on_the_condition_it_guards(app, db_session, probes, strong_hash,
                                                     monkeypatch, check_id):
    monkeypatch.setattr(checks, "MIN_POSTGRES", checks.MIN_POSTGRES)  # restored after
    admin, lead = _strong_people(db_session, strong_hash)
    team = make_team(db_session, lead)
    config = {**app.config, "BACKUP_RETENTION_DAYS": 30}
    _verification(db_session, 0)
    ctx = checks.Context(db_session, config, probes)
    assert _run(check_id, ctx, db_session, team=team).passed is True
    BREAKS[check_id](db_session, config, admin, lead, team)
    db_session.flush()
    db_session.expire_all()
    assert _run(check_id, ctx, db_session, team=team).passed is False


def test_the_app_connected_as_the_owner_fails_the_role_check(app, db_session, owner_session,
                                                             probes):
    assert checks.check_db_role(checks.Context(db_session, app.config, probes)).passed
    check = checks.check_db_role(checks.Context(owner_session, app.config, probes))
    assert check.passed is False and check.measured["owned_relations"] > 0


def test_an_sbom_that_could_not_be_built_fails(app, db_session, probes):
    assert not checks.check_sbom(checks.Context(db_session, app.config, probes), None).passed


def test_a_team_whose_data_location_cannot_be_read_fails(app, db_session, probes):
    team = make_team(db_session, make_user(db_session))
    ctx = checks.Context(db_session, app.config, probes)
    assert not checks.check_team_location(ctx, team, where={"database": None}).passed


def test_no_check_is_left_without_a_test_that_fails_it():
    covered = BROKEN_ELSEWHERE | set(BREAKS) | {"data.db_role", "software.sbom",
                                                 "team.data_location"}
    assert covered == set(BY_ID)


def test_an_old_drill_no_longer_counts(app, db_session, probes):
    from dashboard.evidence.models import EvidenceDrill

    old = datetime.now(UTC) - timedelta(days=91)
    db_session.add(EvidenceDrill(status="ready", ok=True, finished_at=old, steps=[]))
    db_session.flush()
    check = checks.check_drill(checks.Context(db_session, app.config, probes))
    assert (check.passed, check.summary) == (False, "The last drill is older than 90 days.")
