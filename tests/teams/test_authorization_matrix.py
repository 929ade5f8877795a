"""The teams' authorisation matrix: every persona (owner, admin, member, reader, someone who
never was a member, a removed member) × every action × every surface (the pages, the
``/v1`` API, MCP), one expected outcome per cell, each cell its own test
(``pages-member-hard_delete``). The tables were written from the spec, not read from the
code; the rules they encode, and what the cells cost, are in the comment below."""

# - read, search, the team's Memory Status: every role;
# - write and share (policy ``members``, the default): owners, admins, members; readers not;
# - edit, forget (and restore), redact (policy ``author_or_admins``, the default): owners and
#   admins any memory, a member their own, a reader none (not even one they saved);
# - hard delete: owners and admins (a member not even their own); an API key or a connection
#   also needs ``memory:hard_delete``, whatever the role (the scope is checked first);
# - invite, remove, change roles, change the controls, export, read the team audit: owners
#   and admins; an owner is invited, removed, made or unmade by an owner only;
# - the evidence report: owners only (admins 403 like members);
# - anyone not a member — who never was, or was removed — gets what a team that does not
#   exist gets, byte for byte: on the pages the same 404 and words, on the API the same
#   problem+json, on MCP the same tool error. Their credential names the team even so (a
#   key or connection made while a member, or the team written straight to its row): the
#   membership read at each call is what refuses.
#
# A cell that a surface does not offer is ``NA`` with its reason, and a walk of that
# surface (the URL map, MCP's tool list) holds the table to what is really there.
#
# Cost: the Flask-client cells share one world per class (people, the team, memories,
# keys, signed-in clients) built once in an outer transaction; each cell runs in a
# savepoint rolled back after it. The MCP cells share ONE live server and one session per
# persona (the sessions side by side, each its calls in order on memories of its own): the
# calls are made once, and each cell reads its own answer.


from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest
from sqlalchemy import delete
from sqlalchemy.orm import sessionmaker

from dashboard import saved_memories as memories
from dashboard.audit.services import Actor
from dashboard.auth.models import User
from dashboard.connectors import services as connections
from dashboard.connectors.models import OAuthGrant
from dashboard.extensions import db
from dashboard.queues import build_queue
from dashboard.saved_memories import reach as reached
from dashboard.saved_memories.openapi import HEADER
from dashboard.saved_memories.team_pages import PAGE_SCOPES
from dashboard.security import get_limiter
from dashboard.teams import services as teams
from tests.conftest import _TestScopedSession, csrf_from
from tests.connectors.helpers import REDIRECT_URI, live_app
from tests.connectors.test_mcp_refusals import bearer
from tests.factories import PASSWORD, make_key, make_team, make_user
from tests.races import apart
from tests.saved_memories.test_api import assert_problem

PERSONAS = ("owner", "admin", "member", "reader", "nonmember", "removed")
ROLE_OF = {"owner": "owner", "admin": "admin", "member": "member", "reader": "reader",
           "removed": "member"}  # the removed one was a member


@dataclass(frozen=True)
class NA:
    """Not on this surface, and why (a walk of the surface holds this to be so)."""

    reason: str


@dataclass(frozen=True)
class Refused:
    """A refusal on the API or MCP: its status (API), the API's title, and what it says."""

    kind: str  # role, scope, team, memory
    status: int
    title: str


# The API's and MCP's refusals. ROLE: a member whose role (or the team's policy) may
# not; SCOPE: the credential lacks the operation's scope; NO_TEAM: a team out of reach,
# as one that does not exist; NO_MEMORY: a memory out of reach, as one that does not.
ROLE = Refused("role", 403, "Forbidden")
SCOPE = Refused("scope", 403, "Missing scope")
NO_TEAM = Refused("team", 404, "Not found")
NO_MEMORY = Refused("memory", 404, "Not found")
OK = "ok"  # MCP: a result, not a tool error

HARD = "memory:hard_delete"
ON_PAGES_IN_PERSON = ("the pages act for the signed-in person, whose role decides: no "
                      "credential scopes apply there")
TEAMS_ON_PAGES = "teams are managed on the pages only: the API has memory routes alone"
TEAMS_NOT_ON_MCP = "teams are managed on the pages only: MCP has memory tools alone"

# What each row does. Targets: "another's" is a team memory a plain member (the
# bystander) saved; "own" is one the persona saved to the team (the non-member's too,
# written straight through the service: authorship alone must open nothing); "share"
# copies a personal memory of the persona's; "remove"/"change_role" act on the bystander,
# "*_owner" on a second owner.
ACTIONS = {
    "read": "the team's memories (pages: its memories page; API, MCP: the list, team=)",
    "read_one": "one team memory by id, saved by another",
    "search": "a search narrowed to the team",
    "status": "the team's Memory Status",
    "write": "save a new memory to the team",
    "share": "copy one's own personal memory to the team",
    "edit": "change another's team memory",
    "edit_own": "change one's own team memory",
    "forget": "forget (soft-delete) another's team memory",
    "forget_own": "forget one's own team memory",
    "restore": "restore another's forgotten team memory",
    "redact": "redact another's team memory",
    "redact_own": "redact one's own team memory",
    "hard_delete": "erase one's own team memory for good (a credential with the scope)",
    "hard_delete_unscoped": "the same with a credential that lacks memory:hard_delete",
    "invite": "invite an address as a member",
    "invite_owner": "invite an address as an owner",
    "remove": "remove a member",
    "remove_owner": "remove an owner (the team has two)",
    "change_role": "make a member a reader",
    "change_owner_role": "make an owner (of two) an admin",
    "change_policy": "change the team's controls",
    "export": "ask for the team's export",
    "evidence": "ask for the team's evidence report (owners only)",
    "audit": "read the team's audit log",
}

# -- the tables ------------------------------------------------------------------------------
# Pages (signed in with the real form; each POST with its CSRF token): the HTTP status.
# 303 is a POST that worked (it redirects), 200 a page shown (an invitation's link is
# shown once, on a 200). 403: a member whose role may not (with a sentence). 404: not a
# member, with "You are in no team with that name." — byte for byte the answer to the
# same request about /teams/no-such-team/ (only the CSP nonce and the CSRF token's signed
# form differ per request, and are blanked). Sharing is the personal memory's page, whose
# form offers only the teams one may share to: anyone else's choice is a form error, 400
# — the reader and the outsiders alike (the outsiders' page the same bytes as for
# team=no-such-team); the API answers the reader 403.

#                          owner admin member reader nonmember removed
PAGES: dict[str, tuple | NA] = {
    "read":                 (200, 200, 200, 200, 404, 404),
    "read_one":             NA("no page shows one team memory: the team's memories page "
                               "lists each (read)"),
    "search":               NA("the pages have no team search: recall across teams is the "
                               "chat's"),
    "status":               (200, 200, 200, 200, 404, 404),
    "write":                (303, 303, 303, 403, 404, 404),
    "share":                (303, 303, 303, 400, 400, 400),
    "edit":                 (303, 303, 403, 403, 404, 404),
    "edit_own":             (303, 303, 303, 403, 404, 404),
    "forget":               (303, 303, 403, 403, 404, 404),
    "forget_own":           (303, 303, 303, 403, 404, 404),
    "restore":              (303, 303, 403, 403, 404, 404),
    "redact":               (303, 303, 403, 403, 404, 404),
    "redact_own":           (303, 303, 303, 403, 404, 404),
    "hard_delete":          (303, 303, 403, 403, 404, 404),
    "hard_delete_unscoped": NA(ON_PAGES_IN_PERSON),
    "invite":               (200, 200, 403, 403, 404, 404),
    "invite_owner":         (200, 403, 403, 403, 404, 404),
    "remove":               (303, 303, 403, 403, 404, 404),
    "remove_owner":         (303, 403, 403, 403, 404, 404),
    "change_role":          (303, 303, 403, 403, 404, 404),
    "change_owner_role":    (303, 403, 403, 403, 404, 404),
    "change_policy":        (303, 303, 403, 403, 404, 404),
    "export":               (303, 303, 403, 403, 404, 404),
    "evidence":             (303, 403, 403, 403, 404, 404),
    "audit":                (200, 200, 403, 403, 404, 404),
}

# API (an X-API-Key naming the team, scopes read, write, delete, redact and, for
# hard_delete, memory:hard_delete): a status, or a refusal (problem+json).
#                          owner    admin    member   reader   nonmember  removed
API: dict[str, tuple | NA] = {
    "read":                 (200,     200,     200,     200,     NO_TEAM,   NO_TEAM),
    "read_one":             (200,     200,     200,     200,     NO_MEMORY, NO_MEMORY),
    "search":               (200,     200,     200,     200,     NO_TEAM,   NO_TEAM),
    "status":               NA("the API has no Memory Status route (the pages and MCP do)"),
    "write":                (201,     201,     201,     ROLE,    NO_TEAM,   NO_TEAM),
    "share":                (201,     201,     201,     ROLE,    NO_TEAM,   NO_TEAM),
    "edit":                 (200,     200,     ROLE,    ROLE,    NO_MEMORY, NO_MEMORY),
    "edit_own":             (200,     200,     200,     ROLE,    NO_MEMORY, NO_MEMORY),
    "forget":               (200,     200,     ROLE,    ROLE,    NO_MEMORY, NO_MEMORY),
    "forget_own":           (200,     200,     200,     ROLE,    NO_MEMORY, NO_MEMORY),
    "restore":              (200,     200,     ROLE,    ROLE,    NO_MEMORY, NO_MEMORY),
    "redact":               (200,     200,     ROLE,    ROLE,    NO_MEMORY, NO_MEMORY),
    "redact_own":           (200,     200,     200,     ROLE,    NO_MEMORY, NO_MEMORY),
    "hard_delete":          (200,     200,     ROLE,    ROLE,    NO_MEMORY, NO_MEMORY),
    "hard_delete_unscoped": (SCOPE,   SCOPE,   SCOPE,   SCOPE,   SCOPE,     SCOPE),
    "invite":               NA(TEAMS_ON_PAGES),
    "invite_owner":         NA(TEAMS_ON_PAGES),
    "remove":               NA(TEAMS_ON_PAGES),
    "remove_owner":         NA(TEAMS_ON_PAGES),
    "change_role":          NA(TEAMS_ON_PAGES),
    "change_owner_role":    NA(TEAMS_ON_PAGES),
    "change_policy":        NA(TEAMS_ON_PAGES),
    "export":               NA("the API's export is the key owner's own, never a team's"),
    "evidence":             NA(TEAMS_ON_PAGES),
    "audit":                NA(TEAMS_ON_PAGES),
}

# MCP (the SDK's client; a connection naming the team, the same scopes; memory:hard_delete
# is given to it by a staff admin between hard_delete_unscoped and hard_delete): a result
# or the tool error's exact sentence.
#                          owner    admin    member   reader   nonmember  removed
MCP: dict[str, tuple | NA] = {
    "read":                 (OK,      OK,      OK,      OK,      NO_TEAM,   NO_TEAM),
    "read_one":             (OK,      OK,      OK,      OK,      NO_MEMORY, NO_MEMORY),
    "search":               (OK,      OK,      OK,      OK,      NO_TEAM,   NO_TEAM),
    "status":               (OK,      OK,      OK,      OK,      NO_TEAM,   NO_TEAM),
    "write":                (OK,      OK,      OK,      ROLE,    NO_TEAM,   NO_TEAM),
    "share":                NA("MCP has no share tool: an app saves to a team directly"),
    "edit":                 (OK,      OK,      ROLE,    ROLE,    NO_MEMORY, NO_MEMORY),
    "edit_own":             (OK,      OK,      OK,      ROLE,    NO_MEMORY, NO_MEMORY),
    "forget":               (OK,      OK,      ROLE,    ROLE,    NO_MEMORY, NO_MEMORY),
    "forget_own":           (OK,      OK,      OK,      ROLE,    NO_MEMORY, NO_MEMORY),
    "restore":              (OK,      OK,      ROLE,    ROLE,    NO_MEMORY, NO_MEMORY),
    "redact":               (OK,      OK,      ROLE,    ROLE,    NO_MEMORY, NO_MEMORY),
    "redact_own":           (OK,      OK,      OK,      ROLE,    NO_MEMORY, NO_MEMORY),
    "hard_delete":          (OK,      OK,      ROLE,    ROLE,    NO_MEMORY, NO_MEMORY),
    "hard_delete_unscoped": (SCOPE,   SCOPE,   SCOPE,   SCOPE,   SCOPE,     SCOPE),
    "invite":               NA(TEAMS_NOT_ON_MCP),
    "invite_owner":         NA(TEAMS_NOT_ON_MCP),
    "remove":               NA(TEAMS_NOT_ON_MCP),
    "remove_owner":         NA(TEAMS_NOT_ON_MCP),
    "change_role":          NA(TEAMS_NOT_ON_MCP),
    "change_owner_role":    NA(TEAMS_NOT_ON_MCP),
    "change_policy":        NA(TEAMS_NOT_ON_MCP),
    "export":               NA(TEAMS_NOT_ON_MCP),
    "evidence":             NA(TEAMS_NOT_ON_MCP),
    "audit":                NA(TEAMS_NOT_ON_MCP),
}

TABLES = {"pages": PAGES, "api": API, "mcp": MCP}
# What a role refusal says it refused, by action (the memories' reach says it so).
REFUSED_WHAT = {
    "write": "save to it", "share": "share to it", "edit": "change this memory",
    "edit_own": "change this memory", "forget": "delete or restore this memory",
    "forget_own": "delete or restore this memory", "restore": "delete or restore this memory",
    "redact": "redact this memory", "redact_own": "redact this memory",
    "hard_delete": "erase this memory for good"}
UNKNOWN_SLUG = "no-such-team"
UNKNOWN_ID = "6f1c2d3e-0000-4000-8000-00000000abcd"  # no memory has it


def cells(surface: str) -> list[Any]:
    """Every cell a surface offers, as its own test: ``pages-member-hard_delete``."""
    return [pytest.param(persona, action, row[i], id=f"{surface}-{persona}-{action}")
            for action, row in TABLES[surface].items() if not isinstance(row, NA)
            for i, persona in enumerate(PERSONAS)]


def role_sentence(persona: str, action: str) -> str:
    return f"Your role in Pilot ({ROLE_OF[persona]}) does not let you {REFUSED_WHAT[action]}."


def test_the_tables_cover_every_action_on_every_surface():
    for table in TABLES.values():
        assert list(table) == list(ACTIONS)
        assert all(isinstance(row, NA) or len(row) == len(PERSONAS) for row in table.values())


# -- the world the Flask-client cells share --------------------------------------------------

@dataclass
class World:
    team_id: int
    ids: dict[str, int]  # person → user id
    emails: dict[str, str]
    others: str  # a team memory the bystander saved
    others_forgotten: str  # one the bystander saved and then forgot
    own: dict[str, str]  # persona → a team memory they saved
    personal: dict[str, str]  # persona → a personal memory of theirs
    keys: dict[str, str] = field(default_factory=dict)  # persona → a key with hard_delete
    unscoped: dict[str, str] = field(default_factory=dict)  # … and one without it


def build_world(session) -> World:
    """Team "Pilot": its owner and a second owner, an admin, a member, a reader, the
    bystander (a member), someone removed (they saved to it and had keys naming it), and a
    non-member whose keys name the team all the same (written to the key's row)."""
    who = {name: make_user(session, email=f"matrix-{name}@example.test") for name in
           ("owner", "co_owner", "admin", "member", "reader", "nonmember", "removed",
            "bystander")}
    team = make_team(session, who["owner"], slug="pilot", name="Pilot", members={
        who["co_owner"]: "owner", who["admin"]: "admin", who["member"]: "member",
        who["reader"]: "reader", who["removed"]: "member", who["bystander"]: "member"})
    account = session.get(User, team.id)

    def team_memory(author: User, content: str) -> str:
        return str(memories.save_memory(session, owner=account, content=content,
                                        actor=Actor.of(author), author_id=author.id,
                                        source="orbitpilot").memory.id)

    others = team_memory(who["bystander"], "Heron ships in May.")
    forgotten = team_memory(who["bystander"], "Heron's old budget.")
    memories.forget_memory(session, team.id, uuid.UUID(forgotten), mode="soft_delete",
                           actor=Actor.of(who["bystander"]))
    world = World(team.id, {name: user.id for name, user in who.items()},
                  {name: user.email for name, user in who.items()}, others, forgotten,
                  own={p: team_memory(who[p], f"Heron note by {p}.") for p in PERSONAS},
                  personal={p: str(memories.save_memory(
                      session, owner=who[p], content=f"{p}'s own note about Heron.",
                      actor=Actor.of(who[p])).memory.id) for p in PERSONAS})
    everyday = ("memory:read", "memory:write", "memory:delete", "memory:redact")
    for persona in PERSONAS:
        named = [] if persona == "nonmember" else [team.id]
        full, world.keys[persona] = make_key(session, who[persona], scopes=(*everyday, HARD),
                                             team_ids=named)
        bare, world.unscoped[persona] = make_key(session, who[persona], scopes=everyday,
                                                 team_ids=named)
        if persona == "nonmember":  # a credential that names the team anyway
            full.team_ids, bare.team_ids = [team.id], [team.id]
    owner = teams.membership(session, team.id, who["owner"].id)
    teams.remove_member(session, team, owner, who["removed"].id, actor=Actor.of(who["owner"]))
    session.flush()
    return world


class Browser:
    """A test client signed in as one person (the real sign-in form), each request sent
    outside the test's app context; its CSRF token read from the sign-in page, which
    stays valid for the session."""

    def __init__(self, app, email: str) -> None:
        self.client = app.test_client()
        self.token = apart(lambda: csrf_from(self.client, "/auth/signin"))
        signed = apart(lambda: self.client.post("/auth/signin", data={
            "email": email, "password": PASSWORD, "csrf_token": self.token}))
        assert signed.status_code == 302

    def send(self, method: str, path: str, data: dict | None = None):
        if method == "GET":
            return apart(lambda: self.client.get(path))
        return apart(lambda: self.client.post(path, data={"csrf_token": self.token,
                                                          **(data or {})}))


@dataclass
class Shared:
    world: World
    browsers: dict[str, Browser]
    api: Any  # a test client with no cookies, for keys
    connection: Any


@pytest.fixture(scope="class")
def shared(app):
    """The world, built once in a transaction of its own and rolled back at the end."""
    with app.app_context():
        connection = db.engine.connect()
        outer = connection.begin()
        session = _TestScopedSession(sessionmaker(bind=connection,
                                                  join_transaction_mode="create_savepoint"))
        original, db.session = db.session, session
        try:
            get_limiter(app).reset()
            world = build_world(session)
            session.commit()
            browsers = {p: Browser(app, world.emails[p]) for p in PERSONAS}
            session.end()
            db.session = original
            yield Shared(world, browsers, app.test_client(), connection)
        finally:
            session.end()
            db.session = original
            if outer.is_active:
                outer.rollback()
            connection.close()
            build_queue(app).rq().empty()


@pytest.fixture
def cell(app, shared) -> Shared:
    """One cell's savepoint in the shared world: whatever the cell changes is undone."""
    with app.app_context():
        savepoint = shared.connection.begin_nested()
        session = _TestScopedSession(sessionmaker(bind=shared.connection,
                                                  join_transaction_mode="create_savepoint"))
    original, db.session = db.session, session
    try:
        yield shared
    finally:
        with app.app_context():
            session.end()
            if savepoint.is_active:
                savepoint.rollback()
        db.session = original


# -- the pages -------------------------------------------------------------------------------

CONTROLS = {"write_policy": "admins", "forget_policy": "admins", "app_policy": "approve",
            "max_key_days": "30", "leaver_policy": "keep"}
PageRequest = tuple[str, str, dict | None]


def page_request(w: World, persona: str, action: str, slug: str = "pilot") -> PageRequest:
    """The page's real GET or POST for ``action``, on the team ``slug``."""
    memory = f"/teams/{slug}/memories"
    target = {"edit": w.others, "forget": w.others, "redact": w.others,
              "restore": w.others_forgotten}.get(action) or w.own.get(persona)
    bystander, co_owner = str(w.ids["bystander"]), str(w.ids["co_owner"])
    requests: dict[str, PageRequest] = {
        "read": ("GET", f"{memory}/", None),
        "status": ("GET", f"/teams/{slug}/status", None),
        "write": ("POST", f"{memory}/", {"content": "Heron ships on Tuesdays."}),
        "share": ("POST", f"/memories/{w.personal[persona]}/share", {"team": slug}),
        "edit": ("POST", f"{memory}/{target}/edit", {"content": "Heron, changed."}),
        "forget": ("POST", f"{memory}/{target}/forget", {"mode": "soft_delete"}),
        "restore": ("POST", f"{memory}/{target}/restore", {}),
        "redact": ("POST", f"{memory}/{target}/forget", {"mode": "redact"}),
        "hard_delete": ("POST", f"{memory}/{target}/forget", {"mode": "hard_delete"}),
        "invite": ("POST", f"/teams/{slug}/invitations",
                   {"email": "newcomer@example.test", "role": "member"}),
        "invite_owner": ("POST", f"/teams/{slug}/invitations",
                         {"email": "newcomer@example.test", "role": "owner"}),
        "remove": ("POST", f"/teams/{slug}/members/remove", {"user_id": bystander}),
        "remove_owner": ("POST", f"/teams/{slug}/members/remove", {"user_id": co_owner}),
        "change_role": ("POST", f"/teams/{slug}/members/role",
                        {"user_id": bystander, "role": "reader"}),
        "change_owner_role": ("POST", f"/teams/{slug}/members/role",
                              {"user_id": co_owner, "role": "admin"}),
        "change_policy": ("POST", f"/teams/{slug}/settings", CONTROLS),
        "export": ("POST", f"/teams/{slug}/export", {}),
        "evidence": ("POST", f"/teams/{slug}/evidence", {}),
        "audit": ("GET", f"/teams/{slug}/audit", None),
    }
    return requests[action.removesuffix("_own")]


NONCE = re.compile(rb'nonce="[^"]*"')
TOKEN = re.compile(rb'(name="csrf_token"[^>]*value=")[^"]*"')


def normalised(body: bytes) -> bytes:
    """A page without the two things that differ per request: the CSP nonce and the CSRF
    token's signed form (its time stamp)."""
    return TOKEN.sub(rb'\1"', NONCE.sub(b'nonce=""', body))


# -- the API ---------------------------------------------------------------------------------

ApiRequest = tuple[str, str, dict]


def api_request(w: World, persona: str, action: str, *, slug: str = "pilot",
                memory_id: str | None = None) -> ApiRequest:
    """The API call for ``action``; ``memory_id`` replaces the target (an unknown one)."""
    target = memory_id or {"read_one": w.others, "edit": w.others, "forget": w.others,
                           "redact": w.others, "restore": w.others_forgotten
                           }.get(action) or w.own[persona]
    one = f"/v1/memories/{target}"
    requests: dict[str, ApiRequest] = {
        "read": ("GET", "/v1/memories", {"query_string": {"team": slug}}),
        "read_one": ("GET", one, {}),
        "search": ("POST", "/v1/memories/search", {"json": {"query": "Heron", "team": slug}}),
        "write": ("POST", "/v1/memories", {"json": {"content": "Heron ships on Tuesdays.",
                                                    "team": slug}}),
        "share": ("POST", f"/v1/memories/{memory_id or w.personal[persona]}/share",
                  {"json": {"team": slug}}),
        "edit": ("PATCH", one, {"json": {"content": "Heron, changed."}}),
        "forget": ("DELETE", one, {}),
        "restore": ("POST", f"{one}/restore", {}),
        "redact": ("POST", f"{one}/forget", {"json": {"mode": "redact"}}),
        "hard_delete": ("DELETE", one, {"query_string": {"mode": "hard_delete"}}),
        "hard_delete_unscoped": ("DELETE", one, {"query_string": {"mode": "hard_delete"}}),
    }
    return requests[action.removesuffix("_own")]


def api_send(shared: Shared, persona: str, action: str, **target):
    method, path, kwargs = api_request(shared.world, persona, action, **target)
    keys = shared.world.unscoped if action == "hard_delete_unscoped" else shared.world.keys
    headers = {HEADER: keys[persona]}
    return apart(lambda: shared.api.open(path, method=method, headers=headers, **kwargs))


def refusal_detail(refused: Refused, persona: str, action: str) -> str:
    return {"role": lambda: role_sentence(persona, action),
            "team": lambda: reached.NO_SUCH_TEAM,
            "memory": lambda: memories.NOT_FOUND}[refused.kind]()


OUTSIDERS = ("nonmember", "removed")


class TestOnTheFlaskClient:
    """The pages' and the API's cells, in one shared world. An outsider's cell also asks
    the same of a team (or a memory) that does not exist, and gets the same bytes."""

    @pytest.mark.parametrize(("persona", "action", "status"), cells("pages"))
    def test_page(self, cell, persona, action, status):
        browser = cell.browsers[persona]
        answer = browser.send(*page_request(cell.world, persona, action))
        assert answer.status_code == status, answer.get_data(as_text=True)[:400]
        if status == 404:
            assert teams.NO_SUCH_TEAM in answer.get_data(as_text=True)
        if persona in OUTSIDERS:
            unknown = browser.send(*page_request(cell.world, persona, action, UNKNOWN_SLUG))
            assert (unknown.status_code, normalised(unknown.get_data())) == (
                status, normalised(answer.get_data()))

    @pytest.mark.parametrize(("persona", "action", "expected"), cells("api"))
    def test_api(self, cell, persona, action, expected):
        answer = api_send(cell, persona, action)
        if isinstance(expected, int):
            assert answer.status_code == expected, answer.get_data(as_text=True)
        else:
            body = assert_problem(answer, expected.status)
            assert body["title"] == expected.title
            if expected is SCOPE:
                assert HARD in body["detail"]
            else:
                assert body["detail"] == refusal_detail(expected, persona, action)
        if persona in OUTSIDERS:
            by_slug = action in ("read", "search", "write", "share")
            unknown = api_send(cell, persona, action, **(
                {"slug": UNKNOWN_SLUG} if by_slug else {"memory_id": UNKNOWN_ID}))
            assert (unknown.status_code, unknown.mimetype, unknown.get_data()) == (
                answer.status_code, answer.mimetype, answer.get_data())


# -- what each surface does not offer --------------------------------------------------------

# Every /v1 route, and the rows that call it — or, as a sentence, why it is outside the
# matrix: a new route fails here until the table says what it is.
Rows = tuple[str, ...] | str
API_ROUTES: dict[tuple[str, str], Rows] = {
    ("/v1/openapi.json", "GET"): "the public document",
    ("/v1/memories", "GET"): ("read",),
    ("/v1/memories", "POST"): ("write",),
    ("/v1/memories/search", "POST"): ("search",),
    ("/v1/memories/export", "GET"): "the key owner's own export, never a team's",
    ("/v1/memories/<memory_id:memory_id>", "GET"): ("read_one",),
    ("/v1/memories/<memory_id:memory_id>", "PATCH"): ("edit", "edit_own"),
    ("/v1/memories/<memory_id:memory_id>", "DELETE"): ("forget", "forget_own", "hard_delete",
                                                       "hard_delete_unscoped"),
    ("/v1/memories/<memory_id:memory_id>/forget", "POST"): ("redact", "redact_own"),
    ("/v1/memories/<memory_id:memory_id>/restore", "POST"): ("restore",),
    ("/v1/memories/<memory_id:memory_id>/share", "POST"): ("share",),
    ("/v1/memories/<memory_id:memory_id>/receipts", "GET"): "the receipts of a memory one "
                                                             "reads (test_api_teams.py)",
    ("/v1/erasure-receipts/<marker_id>", "GET"): "a receipt of a memory one reads "
                                                 "(test_api_teams.py)",
}
# Every team page (and the personal page that shares to a team), the same way.
TEAM_PAGES: dict[tuple[str, str], Rows] = {
    ("/teams/", "GET"): "one's own teams",
    ("/teams/", "POST"): "creating a team: anyone signed in",
    ("/teams/<slug>/", "GET"): "the team's home: every member (test_pages.py)",
    ("/teams/<slug>/members/role", "POST"): ("change_role", "change_owner_role"),
    ("/teams/<slug>/members/remove", "GET"): "remove's confirm page (test_pages.py)",
    ("/teams/<slug>/members/remove", "POST"): ("remove", "remove_owner"),
    ("/teams/<slug>/leave", "GET"): "leaving: one's own membership (test_pages.py)",
    ("/teams/<slug>/leave", "POST"): "leaving: one's own membership (test_pages.py)",
    ("/teams/<slug>/invitations", "POST"): ("invite", "invite_owner"),
    ("/teams/<slug>/invitations/revoke", "POST"): "withdrawing an invitation: invite's "
                                                  "rule (test_pages.py)",
    ("/teams/join/<token>", "GET"): "an invitation's link: its holder (test_pages.py)",
    ("/teams/join/<token>", "POST"): "an invitation's link: its holder (test_pages.py)",
    ("/teams/<slug>/settings", "GET"): "the controls' page: change_policy's rule "
                                       "(test_pages.py)",
    ("/teams/<slug>/settings", "POST"): ("change_policy",),
    ("/teams/<slug>/settings/apps", "POST"): "the app list: change_policy's rule "
                                             "(test_pages.py)",
    ("/teams/<slug>/access", "GET"): "who can see it: every member (test_pages.py)",
    ("/teams/<slug>/status", "GET"): ("status",),
    ("/teams/<slug>/audit", "GET"): ("audit",),
    ("/teams/<slug>/audit.csv", "GET"): "the audit as CSV: audit's rule (test_pages.py)",
    ("/teams/<slug>/export", "GET"): "the export's page: export's rule "
                                     "(test_team_exports.py)",
    ("/teams/<slug>/export", "POST"): ("export",),
    ("/teams/<slug>/export/<export_id>/download", "POST"): "a made export's download: "
                                                           "export's rule",
    ("/teams/<slug>/evidence", "GET"): "the evidence page: evidence's rule "
                                       "(tests/evidence/test_pages.py)",
    ("/teams/<slug>/evidence", "POST"): ("evidence",),
    ("/teams/<slug>/evidence/drill", "POST"): "the drill: evidence's rule",
    ("/teams/<slug>/evidence/<report_id>/<fmt>", "POST"): "a made report's download: "
                                                          "evidence's rule",
    ("/teams/<slug>/memories/", "GET"): ("read",),
    ("/teams/<slug>/memories/", "POST"): ("write",),
    ("/teams/<slug>/memories/<memory_id>/edit", "GET"): "edit's form (test_pages.py)",
    ("/teams/<slug>/memories/<memory_id>/edit", "POST"): ("edit", "edit_own"),
    ("/teams/<slug>/memories/<memory_id>/forget", "GET"): "forget's confirm page "
                                                          "(test_pages.py)",
    ("/teams/<slug>/memories/<memory_id>/forget", "POST"): (
        "forget", "forget_own", "redact", "redact_own", "hard_delete"),
    ("/teams/<slug>/memories/<memory_id>/restore", "GET"): "restore's confirm page",
    ("/teams/<slug>/memories/<memory_id>/restore", "POST"): ("restore",),
    ("/teams/<slug>/memories/receipts/", "GET"): "the team's receipts: every member",
    ("/teams/<slug>/memories/receipts/<marker_id>", "GET"): "one receipt: every member",
    ("/memories/<memory_id>/share", "GET"): "share's form (test_pages.py)",
    ("/memories/<memory_id>/share", "POST"): ("share",),
}
MCP_TOOLS: dict[str, Rows] = {
    "list_memories": ("read",), "get_memory": ("read_one",), "search_memory": ("search",),
    "memory_status": ("status",), "save_memory": ("write",),
    "update_memory": ("edit", "edit_own"),
    "forget_memory": ("forget", "forget_own", "redact", "redact_own", "hard_delete",
                      "hard_delete_unscoped"),
    "restore_memory": ("restore",),
}


def routes(app, keep: Callable[[str], bool]) -> set[tuple[str, str]]:
    return {(rule.rule, method) for rule in app.url_map.iter_rules() if keep(rule.rule)
            for method in rule.methods - {"HEAD", "OPTIONS"}}


def test_the_api_offers_exactly_the_routes_the_table_knows(app):
    assert routes(app, lambda path: path.startswith("/v1/")) == set(API_ROUTES)


def test_the_pages_offer_exactly_the_team_pages_the_table_knows(app):
    assert routes(app, lambda path: path.startswith(("/teams/", "/memories/<memory_id>/share"))
                  ) == set(TEAM_PAGES)


def test_the_pages_need_no_scope_so_the_unscoped_row_has_no_page():
    # Every operation's scope is the pages' own: the role alone decides there.
    assert set(PAGE_SCOPES) == set(memories.SCOPE_FOR_OPERATION.values())


@pytest.mark.parametrize(("surface", "offered"), [
    ("pages", TEAM_PAGES), ("api", API_ROUTES), ("mcp", MCP_TOOLS)])
def test_the_rows_a_surface_offers_are_exactly_those_its_routes_or_tools_do(surface,
                                                                            offered):
    done = {row for rows in offered.values() if isinstance(rows, tuple) for row in rows}
    assert done == {action for action, row in TABLES[surface].items()
                    if not isinstance(row, NA)}


# -- MCP: one live server, one session per persona -------------------------------------------

MCP_SLUG = "pilot-mcp"  # its own slug: the server's rows are committed


@dataclass
class McpAnswers:
    calls: dict[tuple[str, str], Any]  # (persona, action) → the CallToolResult
    unknown: dict[str, Any]  # action → the same call about no such team or memory
    tools: set[str]


def mcp_call(action: str, targets: dict[str, str], slug: str) -> tuple[str, dict]:
    """The tool and its arguments for ``action`` (``targets``: the persona's memories)."""
    def one(name: str) -> str:
        return targets.get("unknown") or targets[name]

    return {
        "read": ("list_memories", {"team": slug}),
        "read_one": ("get_memory", {"memory_id": one("read_one")}),
        "search": ("search_memory", {"query": "Heron", "team": slug}),
        "status": ("memory_status", {"team": slug}),
        "write": ("save_memory", {"content": "Heron ships on Tuesdays.", "team": slug}),
        "edit": ("update_memory", {"memory_id": one("edit"), "content": "Heron, changed."}),
        "edit_own": ("update_memory", {"memory_id": one("edit_own"),
                                       "content": "Heron, changed."}),
        "forget": ("forget_memory", {"memory_id": one("forget")}),
        "forget_own": ("forget_memory", {"memory_id": one("forget_own")}),
        "restore": ("restore_memory", {"memory_id": one("restore")}),
        "redact": ("forget_memory", {"memory_id": one("redact"), "mode": "redact"}),
        "redact_own": ("forget_memory", {"memory_id": one("redact_own"), "mode": "redact"}),
        "hard_delete_unscoped": ("forget_memory", {"memory_id": one("hard_delete"),
                                                   "mode": "hard_delete"}),
        "hard_delete": ("forget_memory", {"memory_id": one("hard_delete"),
                                          "mode": "hard_delete"}),
    }[action]


# The order the calls are made in: hard_delete_unscoped before a staff admin gives the
# connection memory:hard_delete, hard_delete after (on the same memory).
MCP_ORDER = [action for action, row in MCP.items() if not isinstance(row, NA)
             and action != "hard_delete"] + ["hard_delete"]


@dataclass
class McpWorld:
    tokens: dict[str, str]  # persona → an access token of their connection
    grants: dict[str, int]  # persona → their connection's id
    targets: dict[str, dict[str, str]]  # persona → action → the memory it acts on
    people: list[int]  # every account made (the team's too), removed afterwards
    staff_id: int  # a staff admin, who alone gives memory:hard_delete


def mcp_world(live) -> McpWorld:
    """The team, its people and per persona the memories their calls act on (each call
    its own, so that one persona's forget leaves the next one's target as it was), and a
    connection per persona naming the team. Committed: the server reads them."""
    with live.app.app_context():
        session = db.session
        who = {name: make_user(session) for name in (*PERSONAS, "bystander", "staff")}
        who["staff"].role = "admin"
        team = make_team(session, who["owner"], slug=MCP_SLUG, name="Pilot", members={
            who["admin"]: "admin", who["member"]: "member", who["reader"]: "reader",
            who["removed"]: "member", who["bystander"]: "member"})
        account = session.get(User, team.id)

        def saved(author: str, content: str) -> str:
            return str(memories.save_memory(
                session, owner=account, content=content, actor=Actor.of(who[author]),
                author_id=who[author].id, source="orbitpilot").memory.id)

        targets: dict[str, dict[str, str]] = {}
        for persona in PERSONAS:
            mine = targets[persona] = {
                name: saved("bystander", f"Heron {name} for {persona}.")
                for name in ("read_one", "edit", "forget", "redact", "restore")}
            for name in ("edit_own", "forget_own", "redact_own", "hard_delete"):
                mine[name] = saved(persona, f"Heron {name} by {persona}.")
            memories.forget_memory(session, team.id, uuid.UUID(mine["restore"]),
                                   mode="soft_delete", actor=Actor.of(who["bystander"]))
        tokens, grants = {}, {}
        for persona in PERSONAS:
            client, _ = connections.register_client(session, {
                "client_name": f"Matrix {persona}", "redirect_uris": [REDIRECT_URI],
                "token_endpoint_auth_method": "none"})
            grant = connections.consent(
                session, user=who[persona], client=client,
                scopes=["memory:read", "memory:write", "memory:delete", "memory:redact"],
                resource=f"{live.url}/mcp", allowed=True,
                team_ids=[] if persona == "nonmember" else [team.id])
            if persona == "nonmember":  # a connection that names the team anyway
                grant.team_ids = [team.id]
            grants[persona] = grant.id
            tokens[persona] = access = connections.new_secret(connections.ACCESS_PREFIX)
            connections.store_tokens(session, grant, access=access, refresh=None, scopes=[
                "memory:read", "memory:write", "memory:delete", "memory:redact", HARD],
                lifetimes=connections.Lifetimes())
        owner = teams.membership(session, team.id, who["owner"].id)
        teams.remove_member(session, team, owner, who["removed"].id,
                            actor=Actor.of(who["owner"]))
        session.commit()
        made = McpWorld(tokens, grants, targets, [user.id for user in who.values()] +
                        [team.id], who["staff"].id)
        session.remove()
    return made


def give_hard_delete(live, grant_id: int, staff_id: int) -> None:
    """A staff admin gives the connection memory:hard_delete (only staff may)."""
    with live.app.app_context():
        session = db.session
        assert connections.grant_hard_delete(session, session.get(OAuthGrant, grant_id),
                                             actor=Actor.of(session.get(User, staff_id)))
        session.commit()
        session.remove()


@pytest.fixture(scope="class")
def mcp(app) -> McpAnswers:
    """Every MCP cell's call, made once: one live server, one session per persona."""
    with live_app() as live:
        world = mcp_world(live)
        try:
            answers = anyio.run(_ask_everything, live, world)
        finally:
            with live.app.app_context():
                db.session.rollback()
                db.session.execute(delete(User).where(User.id.in_(world.people)))
                db.session.commit()
                db.session.remove()
    return answers


async def _ask_everything(live, world: McpWorld) -> McpAnswers:
    """Each persona's session in a task of its own, all at once (their targets are
    their own); the calls about no such team or memory from the non-member's session."""
    answers = McpAnswers({}, {}, set())

    async def persona_calls(persona: str) -> None:
        async with bearer(live.url, world.tokens[persona]) as session:
            if persona == "owner":
                answers.tools = {tool.name for tool in (await session.list_tools()).tools}
            for action in MCP_ORDER:
                if action == "hard_delete":
                    await anyio.to_thread.run_sync(give_hard_delete, live,
                                                   world.grants[persona], world.staff_id)
                tool, arguments = mcp_call(action, world.targets[persona], MCP_SLUG)
                answers.calls[persona, action] = await session.call_tool(tool, arguments)
                if persona == "nonmember":
                    tool, arguments = mcp_call(action, {"unknown": UNKNOWN_ID}, UNKNOWN_SLUG)
                    answers.unknown[action] = await session.call_tool(tool, arguments)

    async with anyio.create_task_group() as group:
        for persona in PERSONAS:
            group.start_soon(persona_calls, persona)
    return answers


def tool_error(result) -> str:
    """A tool error's sentence (the SDK says which tool first)."""
    assert result.is_error, result.structured_content
    return result.content[0].text.removeprefix("Error executing tool ").partition(": ")[2]


class TestOverMcp:
    """MCP's cells: the SDK's own client against a really running server."""

    pytestmark = pytest.mark.processes  # a served app

    def test_mcp_offers_exactly_the_tools_the_table_knows(self, mcp):
        assert mcp.tools == set(MCP_TOOLS)

    @pytest.mark.parametrize(("persona", "action", "expected"), cells("mcp"))
    def test_mcp(self, mcp, persona, action, expected):
        result = mcp.calls[persona, action]
        if expected == OK:
            assert not result.is_error, result.content[0].text
        else:
            said = tool_error(result)
            if expected is SCOPE:
                assert said == (f"This connection may not do that: it needs the {HARD} "
                                "scope. Connect again and allow it.")
            else:
                assert said == refusal_detail(expected, persona, action)
        if persona in OUTSIDERS:  # byte for byte what no such team (or memory) gets
            assert result.model_dump_json() == mcp.unknown[action].model_dump_json()
