"""Only a POST changes anything: every route of the app (Flask-Admin and the API included),
as every identity, with GET, HEAD and OPTIONS on real records — and not one row of any
table changes (a checksum of every table before and after). HEAD answers as GET does,
without a body."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pytest
from flask import url_for
from sqlalchemy import text

from dashboard.audit.services import SYSTEM
from dashboard.auth.models import User
from dashboard.documents.models import Document
from dashboard.orbitpilot.models import ProfileFact
from dashboard.saved_memories import forget_memory
from dashboard.teams.services import invite, membership
from tests.conftest import csrf_from
from tests.factories import (
    ALL_SCOPES,
    make_blink,
    make_build_record,
    make_connection,
    make_conversation,
    make_key,
    make_memory,
    make_plan,
    make_team,
    make_user,
)

IDENTITIES = ("guest", "user", "support", "admin", "api_key")
SAFE = ("GET", "HEAD", "OPTIONS")
FILE_RULES = {"static", "admin.static"}


@dataclass
class World:
    emails: dict[str, str]
    secret: str  # the owner's API key
    ids: dict[str, int]  # what a ``?id=`` names, by the view it is for
    args: dict[str, object]  # what a path argument names
    by_endpoint: dict[str, dict[str, object]] = field(default_factory=dict)  # … for one view


@pytest.fixture
def world(app, db_session) -> World:
    """Everything a GET could touch, owned by the walking user: a Blink, a document, a
    profile fact, a key, a conversation, a memory with a receipt, a build, a team they
    lead."""
    plan = make_plan(db_session, name="Safe plan")
    emails = {role: make_user(db_session, role=role, email=f"safe-{role}@example.test").email
              for role in ("support", "admin")}
    owner = make_user(db_session, plan=plan, email="safe-user@example.test")
    emails["user"] = owner.email
    blink = make_blink(db_session, owner, "a blink to keep")
    document = Document(user_id=owner.id, title="notes", filename="notes.md",
                        content="a document to keep")
    fact = ProfileFact(user_id=owner.id, key="city", value="Porto")
    db_session.add_all([document, fact])
    key, secret = make_key(db_session, owner, scopes=ALL_SCOPES)
    connection, _ = make_connection(db_session, owner, scopes=("memory:read",))
    conversation, _ = make_conversation(db_session, owner, [("question", "answer")])
    memory = make_memory(db_session, owner, "a memory to keep")
    gone = make_memory(db_session, owner, "a memory already forgotten")
    receipt = forget_memory(db_session, owner.id, gone.id, mode="soft_delete", actor=SYSTEM)
    build = make_build_record(owner)
    db_session.add(build)
    # A team the walking user owns, with a memory, a receipt and an invitation.
    team = make_team(db_session, owner, slug="safe-team", name="Safe team",
                     members={make_user(db_session): "member"})
    team_memory = make_memory(db_session, db_session.get(User, team.id), "a team memory")
    team_receipt = forget_memory(db_session, team.id, team_memory.id, mode="soft_delete",
                                 actor=SYSTEM)
    invited = invite(db_session, team, membership(db_session, team.id, owner.id),
                     email="safe-invitee@example.test", role="member", actor=SYSTEM)
    # Committed (a savepoint released): a request that rolls back keeps these rows.
    db_session.commit()
    ids = {"blinks": blink.id, "documents": document.id, "profile": fact.id, "keys": key.id,
           "plan": plan.id, "user": owner.id, "api_keys": key.id, "builds": build.id,
           "markers": receipt.marker_id, "audit": 1, "connections": connection.id}
    args = {"memory_id": memory.id, "marker_id": receipt.marker_id,
            "conversation_id": conversation.id, "user_id": owner.id, "export_type": "csv",
            "filename": "admin-csp.js", "grant_id": connection.id, "team_id": team.id,
            "slug": team.slug, "token": invited.token}
    # The team memories pages name the team's memory and receipt.
    team_args = {"memory_id": team_memory.id, "marker_id": team_receipt.marker_id}
    by_endpoint = {rule.endpoint: team_args for rule in app.url_map.iter_rules()
                   if rule.endpoint.startswith("team_memories.")}
    return World(emails, secret, ids, args, by_endpoint)


def checksums(session) -> dict[str, str]:
    """Every table of the schema, each row as text, hashed in a stable order."""
    tables = session.execute(text(
        "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename"
    )).scalars().all()
    return {table: session.execute(text(
        f'SELECT md5(coalesce(string_agg(t::text, \'|\' ORDER BY t::text), \'\')) '
        f'FROM "{table}" AS t')).scalar_one() for table in tables}


def paths(app, world: World) -> list[tuple[str, str]]:
    """(endpoint, path) for every rule: path arguments filled with real records, and the
    record a view reads from ``?id=``."""
    found = []
    with app.test_request_context():
        for rule in sorted(app.url_map.iter_rules(), key=lambda r: (r.rule, r.endpoint)):
            own = world.by_endpoint.get(rule.endpoint, {})
            values = {name: own.get(name, world.args.get(name, "x")) for name in rule.arguments}
            if rule.endpoint in FILE_RULES:
                values["filename"] = "admin-csp.js" if rule.endpoint == "static" \
                    else "admin/js/filters.js"
            path = url_for(rule.endpoint, **values)
            blueprint = rule.endpoint.partition(".")[0]
            if blueprint in world.ids:
                path += f"?id={world.ids[blueprint]}"
            found.append((rule.endpoint, path))
    return found


def _sign_in(client, auth, world: World, identity: str) -> dict[str, str]:
    if identity == "api_key":
        return {"X-API-Key": world.secret}
    if identity != "guest":
        assert auth.login(world.emails[identity]).status_code == 302
    csrf_from(client, "/auth/signin" if identity == "guest" else "/")  # a browser session
    return {}


@pytest.mark.parametrize("identity", IDENTITIES)
def test_no_get_head_or_options_changes_a_row(app, client, auth, db_session, world, identity):
    headers = _sign_in(client, auth, world, identity)
    before = checksums(db_session)
    answered = []
    for endpoint, path in paths(app, world):
        for method in SAFE:
            response = client.open(path, method=method, headers=headers)
            answered.append((method, endpoint, response.status_code))
            assert response.status_code < 500, (method, path)
    after = checksums(db_session)
    changed = sorted(table for table in before if before[table] != after[table])
    if identity == "api_key":
        # The one write a read may make: the key's last use, stamped at most once a
        # minute (its owner sees it). Nothing else of the key, nor any other table.
        assert changed in ([], ["api_keys"])
        before.pop("api_keys"), after.pop("api_keys")
        changed = sorted(table for table in before if before[table] != after[table])
    assert changed == [], f"{identity}: {changed} changed"
    # The walk really reached the records: some GETs answered 200.
    assert sum(1 for method, _, status in answered if method == "GET" and status == 200) > 3


@pytest.mark.parametrize("identity", ("guest", "user", "admin"))
def test_head_answers_as_get_does_without_a_body(app, client, auth, db_session, world,
                                                  identity):
    headers = _sign_in(client, auth, world, identity)
    differ = []
    for endpoint, path in paths(app, world):
        got = client.get(path, headers=headers)
        head = client.head(path, headers=headers)
        if head.status_code != got.status_code:
            differ.append(f"{endpoint} {path}: GET {got.status_code}, HEAD {head.status_code}")
        assert head.get_data() == b"", path
    assert differ == []


def test_a_confirmation_page_is_a_get_and_the_delete_is_a_post(client, auth, db_session,
                                                                world):
    auth.login(world.emails["user"])
    blink = world.ids["blinks"]
    assert client.head(f"/blinks/delete/?id={blink}").status_code == 200
    page = client.get(f"/blinks/delete/?id={blink}")
    assert page.status_code == 200
    assert re.search(r'<form[^>]+method="post"', page.get_data(as_text=True), re.I)
    refused = client.post(f"/blinks/delete/?id={blink}")  # no CSRF token
    assert refused.status_code == 400
    assert client.get(f"/blinks/delete/?id={blink}").status_code == 200  # still there
