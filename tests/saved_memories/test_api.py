"""The memory API: every endpoint's answer and body shape, the order of
checks (key → scope → target → state), problem+json for every refusal, the per-key rate
limit, the CSRF exemption, recall after forgetting, attribution, the audit trail, and the
OpenAPI document against the URL map."""

from __future__ import annotations

import json
import logging
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select

from dashboard import saved_memories as memories
from dashboard.audit.models import AuditEvent
from dashboard.audit.services import Actor
from dashboard.extensions import db
from dashboard.memory import MemoryBuild
from dashboard.memory.search import NOTHING_TO_SEARCH
from dashboard.plans.sentences import state_sentence
from dashboard.plans.services import resolve_build_sources
from dashboard.saved_memories import reach as reached
from dashboard.saved_memories.api import KEY_IN_URL
from dashboard.saved_memories.keys import create_key, grant_hard_delete, revoke_key
from dashboard.saved_memories.models import ApiKey, Memory
from dashboard.saved_memories.openapi import HEADER, PROBLEM
from dashboard.security import TOO_DEEP
from dashboard.sources import SAVED
from tests.factories import build, make_plan, make_user, plans_of, settle

USER_SCOPES = ("memory:read", "memory:write", "memory:delete", "memory:redact")
PROBLEM_KEYS = {"type", "title", "status", "detail"}
CANARY = "canary-5e1d-only-in-content"


def new_key(session, owner, scopes=USER_SCOPES, *, hard_delete: bool = False,
            **kwargs) -> tuple[ApiKey, str]:
    key, raw = create_key(session, owner=owner, name="test client", scopes=list(scopes),
                          actor=Actor.of(owner), **kwargs)
    if hard_delete:
        admin = make_user(session, role="admin")
        assert grant_hard_delete(session, key, actor=Actor.of(admin))
    # Committed (a savepoint released): a refused call rolls back, and must not take
    # the test's own rows with it.
    session.commit()
    return key, raw


@dataclass
class Api:
    """A client that sends ``raw`` as its X-API-Key."""

    client: object
    raw: str | None

    def __call__(self, method: str, path: str, **kwargs):
        headers = {**({HEADER: self.raw} if self.raw else {}), **kwargs.pop("headers", {})}
        return self.client.open(path, method=method, headers=headers, **kwargs)

    def get(self, path: str, **kwargs):
        return self("GET", path, **kwargs)

    def post(self, path: str, **kwargs):
        return self("POST", path, **kwargs)

    def patch(self, path: str, **kwargs):
        return self("PATCH", path, **kwargs)

    def delete(self, path: str, **kwargs):
        return self("DELETE", path, **kwargs)


@pytest.fixture
def owner(db_session):
    return make_user(db_session)


@pytest.fixture
def key(db_session, owner):
    return new_key(db_session, owner, hard_delete=True)


@pytest.fixture
def api(client, key, queue) -> Api:
    return Api(client, key[1])


@pytest.fixture
def stranger(db_session):
    """Another owner with a memory of their own."""
    user = make_user(db_session)
    memory = memories.save_memory(db_session, owner=user, content="Someone else's.",
                                  actor=Actor.of(user)).memory
    db_session.commit()
    return user, memory


def save(api: Api, content: str = "Prefers aisle seats.", **fields) -> dict:
    response = api.post("/v1/memories", json={"content": content, **fields})
    assert response.status_code == 201, response.get_data(as_text=True)
    return response.get_json()["memory"]


def assert_problem(response, status: int) -> dict:
    assert response.status_code == status, response.get_data(as_text=True)
    assert response.mimetype == PROBLEM
    body = response.get_json()
    assert PROBLEM_KEYS <= set(body) <= PROBLEM_KEYS | {"errors"}
    assert body["type"] == "about:blank"
    assert body["status"] == status
    assert body["detail"]
    return body


def recalled_ids(api: Api, query: str) -> list[str | None]:
    response = api.post("/v1/memories/search", json={"query": query, "k": 50})
    assert response.status_code == 200
    return [hit["memory_id"] for hit in response.get_json()["results"]]


MEMORY_FIELDS = {"id", "content", "metadata", "source", "client_name", "status", "version",
                 "created_at", "updated_at", "deleted_at", "redacted_at", "owner",
                 "attribution"}
RECEIPT_FIELDS = {"marker_id", "memory_id", "mode", "from_status", "to_status", "version",
                  "reason", "removed", "audit_event", "created_at", "vacuum", "probe",
                  "pending", "completed_by"}


# -- saving ----------------------------------------------------------------------------------

def test_save_answers_201_with_location_memory_notice_and_build(api, owner, key, db_session):
    response = api.post("/v1/memories", json={"content": "Likes green tea.",
                                              "metadata": {"topic": "drinks"}})
    assert response.status_code == 201
    body = response.get_json()
    assert set(body) == {"memory", "remembered", "memory_notice", "build"}
    memory = body["memory"]
    assert set(memory) == MEMORY_FIELDS
    assert (memory["content"], memory["metadata"], memory["source"], memory["status"],
            memory["version"]) == ("Likes green tea.", {"topic": "drinks"}, "api", "active", 1)
    assert response.headers["Location"] == f"/v1/memories/{memory['id']}"
    assert set(body["build"]) == {"id", "merged"} and isinstance(body["build"]["id"], int)
    assert response.headers["Cache-Control"] == "no-store"
    row = db_session.get(Memory, uuid.UUID(memory["id"]))
    assert row.api_key_id == key[0].id and row.owner_id == owner.id


def test_the_build_a_save_answers_is_the_one_its_change_queued(api, owner, db_session):
    """The first save queues the build (merged: false); a second, while it waits, joins
    it (merged: true) — one queued row either way."""
    settle(db_session)
    first = api.post("/v1/memories", json={"content": "Likes green tea."}).get_json()
    second = api.post("/v1/memories", json={"content": "Likes oolong."}).get_json()
    assert first["build"]["merged"] is False and second["build"]["merged"] is True
    assert first["build"]["id"] == second["build"]["id"]
    queued = db_session.scalars(select(MemoryBuild.id).where(
        MemoryBuild.user_id == owner.id, MemoryBuild.status == "queued")).all()
    assert queued == [first["build"]["id"]]


def test_save_says_remembered_in_the_status_pages_words(api, owner, db_session):
    body = api.post("/v1/memories", json={"content": "Allergic to peanuts."}).get_json()
    resolution = resolve_build_sources(owner, plans_of(db_session))
    assert body["remembered"] is True
    assert body["memory_notice"] == state_sentence(resolution.get(SAVED), resolution)


def test_save_on_a_plan_whose_cap_evicts_saved_memories_says_so(client, db_session, queue):
    plan = make_plan(db_session, cap=1)  # the profile fills the only place
    owner = make_user(db_session, plan=plan)
    api = Api(client, new_key(db_session, owner)[1])
    body = api.post("/v1/memories", json={"content": "Allergic to peanuts."}).get_json()
    resolution = resolve_build_sources(owner, plans_of(db_session))
    expected = state_sentence(resolution.get(SAVED), resolution)
    assert body["remembered"] is False
    assert body["memory_notice"] == expected
    assert expected.startswith("Not remembered")


def test_the_source_is_the_client_that_saved_it(api):
    assert save(api, source="chatgpt")["source"] == "chatgpt"


# -- reading ---------------------------------------------------------------------------------

def test_get_answers_the_memory(api):
    memory = save(api, metadata={"a": 1})
    response = api.get(f"/v1/memories/{memory['id']}")
    assert response.status_code == 200
    assert response.get_json() == memory
    assert response.headers["Cache-Control"] == "no-store"


def test_list_answers_items_and_next_cursor(api):
    first, second = save(api, "One."), save(api, "Two.")
    response = api.get("/v1/memories")
    assert response.status_code == 200
    body = response.get_json()
    assert set(body) == {"items", "next_cursor"}
    # One transaction in tests: both share created_at (now()), so the order is by id.
    assert sorted(m["id"] for m in body["items"]) == sorted([second["id"], first["id"]])
    assert body["items"][0] in (first, second)
    assert body["next_cursor"] is None


def test_list_filters_by_status(api):
    kept, gone = save(api, "Kept."), save(api, "Gone.")
    assert api.delete(f"/v1/memories/{gone['id']}").status_code == 200
    response = api.get("/v1/memories?status=deleted")
    assert response.status_code == 200
    assert [m["id"] for m in response.get_json()["items"]] == [gone["id"]]
    assert kept["id"] not in response.get_data(as_text=True)


def _insert(session, owner, count: int, *, distinct_times: int | None = None) -> list[str]:
    start = datetime(2030, 1, 1, tzinfo=UTC)
    rows = [Memory(owner_id=owner.id, content=f"Memory {i}.", created_at=start + timedelta(
        seconds=i % (distinct_times or count))) for i in range(count)]
    session.add_all(rows)
    session.commit()
    return [str(row.id) for row in rows]


def test_cursor_pagination_gives_each_memory_exactly_once(api, owner, db_session):
    # 15 timestamps for 45 rows: ties are broken by id, never skipped or repeated.
    ids = _insert(db_session, owner, 45, distinct_times=15)
    seen, cursor, pages = [], "", 0
    while True:
        response = api.get(f"/v1/memories?limit=10&cursor={cursor}")
        assert response.status_code == 200
        body = response.get_json()
        seen += [m["id"] for m in body["items"]]
        pages += 1
        if body["next_cursor"] is None:
            break
        cursor = body["next_cursor"]
    assert pages == 5
    assert len(seen) == 45 and sorted(seen) == sorted(ids)


def test_limit_is_clamped_to_100(api, owner, db_session):
    _insert(db_session, owner, 101)
    response = api.get("/v1/memories?limit=1000")
    assert response.status_code == 200
    assert len(response.get_json()["items"]) == 100


def test_limit_zero_is_clamped_to_one(api, owner, db_session):
    _insert(db_session, owner, 3)
    response = api.get("/v1/memories?limit=0")
    assert response.status_code == 200
    assert len(response.get_json()["items"]) == 1


# -- changing --------------------------------------------------------------------------------

def test_patch_changes_content_and_bumps_the_version(api):
    memory = save(api)
    response = api.patch(f"/v1/memories/{memory['id']}", json={"content": "Prefers windows."})
    assert response.status_code == 200
    body = response.get_json()
    assert set(body) == MEMORY_FIELDS
    assert (body["content"], body["version"], body["metadata"]) == ("Prefers windows.", 2, {})


def test_patch_of_a_deleted_memory_is_409(api):
    memory = save(api)
    assert api.delete(f"/v1/memories/{memory['id']}").status_code == 200
    assert_problem(api.patch(f"/v1/memories/{memory['id']}", json={"content": "x"}), 409)


# -- recall ----------------------------------------------------------------------------------

def test_a_search_that_matches_nothing_says_so(api, owner, db_session):
    api.post("/v1/memories", json={"content": "Prefers aisle seats on long flights."})
    build(db_session, owner)
    near = api.post("/v1/memories/search", json={"query": "aisle seats", "k": 3}).get_json()
    assert len(near["results"]) == 1 and near["notice"] is None
    response = api.post("/v1/memories/search", json={"query": "passport renewal", "k": 3})
    assert response.status_code == 200
    assert response.get_json() == {"results": [], "notice": memories.NO_MATCH}


def test_search_names_the_client_and_the_memory(api, owner, db_session):
    memory = save(api, "Flies with ChatGPT's help to Lisbon.", source="chatgpt")
    build(db_session, owner, commit=True)
    response = api.post("/v1/memories/search", json={"query": "Lisbon flights", "k": 3})
    assert response.status_code == 200
    body = response.get_json()
    assert set(body) == {"results", "notice"} and body["notice"] is None  # it matched
    hit = next(h for h in body["results"] if h["memory_id"] == memory["id"])
    assert set(hit) == {"content", "distance", "source_key", "source", "memory_id",
                        "source_id", "chunk_index", "owner", "attribution", "match",
                        "relevance"}
    assert hit["match"] == "semantic"  # no name or code in the query: by meaning alone
    assert hit["relevance"] == "relevant"  # the hashing embedder is sure of what it keeps
    assert (hit["source_key"], hit["source"], hit["source_id"], hit["owner"]) == \
        (SAVED, "chatgpt", memory["id"], "personal")
    # Who saved it is the key, whatever the client said of itself.
    assert hit["attribution"]["key"]["prefix"] == memory["attribution"]["key"]["prefix"]


@pytest.mark.parametrize("mode", ["soft_delete", "redact", "hard_delete"])
def test_search_right_after_forgetting_no_longer_returns_it(api, owner, db_session, mode):
    memory = save(api, "Keeps a spare key under the blue flowerpot.")
    build(db_session, owner, commit=True)
    assert memory["id"] in recalled_ids(api, "spare key flowerpot")
    response = api.post(f"/v1/memories/{memory['id']}/forget", json={"mode": mode})
    assert response.status_code == 200
    assert memory["id"] not in recalled_ids(api, "spare key flowerpot")


def strict_json(response) -> object:
    """The body as JSON that parsers other than Python's accept: NaN, Infinity and
    -Infinity are not JSON, and Python's json module would read them silently."""
    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} in {response.request.method} {response.request.path}")

    return json.loads(response.get_data(as_text=True), parse_constant=refuse)


@pytest.mark.parametrize("query", ["!!!", "the and of it", "?!… —"])
def test_a_query_with_nothing_to_search_on_is_a_422_naming_the_query(api, owner, db_session,
                                                                     query):
    save(api, "Prefers aisle seats on long flights.")
    build(db_session, owner, commit=True)
    response = api.post("/v1/memories/search", json={"query": query, "k": 3})
    body = assert_problem(response, 422)
    assert body["errors"] == [{"field": "query", "detail": NOTHING_TO_SEARCH}]
    strict_json(response)


def test_a_memory_with_nothing_to_search_on_is_never_recalled(api, owner, db_session):
    seats, _ = save(api, "Prefers aisle seats on long flights."), save(api, "!!!")
    build(db_session, owner, commit=True)
    response = api.post("/v1/memories/search", json={"query": "aisle seats", "k": 10})
    assert response.status_code == 200
    results = strict_json(response)["results"]
    assert [hit["memory_id"] for hit in results if hit["source_key"] == SAVED] == [seats["id"]]
    assert all(0 <= hit["distance"] <= 2 for hit in results)


def test_no_api_answer_holds_nan_or_infinity(api, owner, db_session, key):
    """Every answer of a small scenario read by a strict parser."""
    kept, blank = save(api, "Reads poetry on Sundays."), save(api, "...")
    build(db_session, owner, commit=True)
    responses = [
        api.get("/v1/openapi.json"), api.get("/v1/memories"),
        api.get(f"/v1/memories/{kept['id']}"), api.get("/v1/memories/export"),
        api.post("/v1/memories/search", json={"query": "poetry", "k": 5}),
        api.post("/v1/memories/search", json={"query": "Sundays poetry reads", "k": 50}),
        api.post("/v1/memories/search", json={"query": "...", "k": 5}),
        api.patch(f"/v1/memories/{kept['id']}", json={"metadata": {"day": "Sunday"}}),
        api.post(f"/v1/memories/{blank['id']}/forget", json={"mode": "soft_delete"}),
        api.post(f"/v1/memories/{blank['id']}/restore"),
        api.get(f"/v1/memories/{blank['id']}/receipts"),
        api.delete(f"/v1/memories/{blank['id']}?mode=hard_delete"),
        api.get(f"/v1/memories/{blank['id']}"), api.get(f"/v1/memories/{uuid.uuid4()}"),
        api.post("/v1/memories", json={"content": ""}),
        api.post("/v1/memories/search", json={"query": "x", "k": 0}),
    ]
    assert {r.status_code for r in responses} == {200, 410, 404, 422}
    for response in responses:
        assert response.mimetype in ("application/json", PROBLEM)
        strict_json(response)


def test_the_document_says_a_query_needs_something_to_search_on(client):
    search = client.get("/v1/openapi.json").get_json()["paths"]["/v1/memories/search"]["post"]
    assert "422" in search["responses"]
    schema = client.get("/v1/openapi.json").get_json()["components"]["schemas"]
    assert "422" in schema["SearchRequest"]["properties"]["query"]["description"]


def test_export_holds_memories_and_chunks(api, owner, db_session):
    memory = save(api, "Reads poetry on Sundays.")
    build(db_session, owner, commit=True)
    response = api.get("/v1/memories/export")
    assert response.status_code == 200
    assert re.fullmatch(r"attachment; filename=orbitpilot-memories-\d{4}-\d\d-\d\d\.json",
                        response.headers["Content-Disposition"])
    body = response.get_json()
    assert set(body) == {"owner_id", "exported_at", "memories", "chunks"}
    assert body["owner_id"] == owner.id
    assert [m["id"] for m in body["memories"]] == [memory["id"]]
    assert memory["id"] in {c["source_id"] for c in body["chunks"] if c["source_key"] == SAVED}


# -- forgetting and restoring ----------------------------------------------------------------

def test_delete_soft_deletes_by_default_and_answers_the_receipt(api):
    memory = save(api)
    response = api.delete(f"/v1/memories/{memory['id']}?reason=asked%20by%20user")
    assert response.status_code == 200
    body = response.get_json()
    assert set(body) == {"receipt"}
    receipt = body["receipt"]
    assert set(receipt) == RECEIPT_FIELDS
    assert (receipt["mode"], receipt["from_status"], receipt["to_status"], receipt["reason"],
            receipt["memory_id"]) == ("soft_delete", "active", "deleted", "asked by user",
                                      memory["id"])
    assert set(receipt["audit_event"]) == {"id", "hash"} and receipt["audit_event"]["hash"]
    assert receipt["probe"]["rows"] == 0 and receipt["probe"]["at"]
    assert api.get(f"/v1/memories/{memory['id']}").get_json()["status"] == "deleted"


def test_forget_redact_keeps_the_replacement(api):
    memory = save(api, metadata={"k": "v"})
    response = api.post(f"/v1/memories/{memory['id']}/forget", json={
        "mode": "redact", "reason": "privacy", "replacement_content": "[a seat preference]"})
    assert response.status_code == 200
    body = response.get_json()
    assert set(body) == {"receipt", "memory"}
    assert (body["memory"]["content"], body["memory"]["status"], body["memory"]["metadata"]) \
        == ("[a seat preference]", "redacted", {})
    assert body["receipt"]["mode"] == "redact"


def test_forget_hard_delete_answers_no_memory_and_then_410(api):
    memory = save(api)
    response = api.post(f"/v1/memories/{memory['id']}/forget", json={"mode": "hard_delete"})
    assert response.status_code == 200
    body = response.get_json()
    assert body["memory"] is None
    assert (body["receipt"]["mode"], body["receipt"]["to_status"]) == ("hard_delete", None)
    assert_problem(api.get(f"/v1/memories/{memory['id']}"), 410)


def test_restore_answers_memory_receipt_and_build(api):
    memory = save(api)
    assert api.delete(f"/v1/memories/{memory['id']}").status_code == 200
    response = api.post(f"/v1/memories/{memory['id']}/restore", json={"reason": "oops"})
    assert response.status_code == 200
    body = response.get_json()
    assert set(body) == {"memory", "receipt", "build"}
    assert (body["memory"]["status"], body["memory"]["version"]) == ("active", 3)
    assert (body["receipt"]["mode"], body["receipt"]["reason"]) == ("restore", "oops")
    assert set(body["build"]) == {"id", "merged"}


@pytest.mark.parametrize("kwargs", [{}, {"json": {}},
                                    {"data": "", "content_type": "application/json"}],
                         ids=["no body", "empty object", "empty json body"])
def test_restore_needs_no_body(api, kwargs):
    memory = save(api)
    assert api.delete(f"/v1/memories/{memory['id']}").status_code == 200
    assert api.post(f"/v1/memories/{memory['id']}/restore", **kwargs).status_code == 200


def test_receipts_list_and_one_receipt(api):
    memory = save(api)
    deleted = api.delete(f"/v1/memories/{memory['id']}").get_json()["receipt"]
    restored = api.post(f"/v1/memories/{memory['id']}/restore").get_json()["receipt"]
    response = api.get(f"/v1/memories/{memory['id']}/receipts")
    assert response.status_code == 200
    assert response.get_json() == {"items": [deleted, restored]}
    one = api.get(f"/v1/erasure-receipts/{deleted['marker_id']}")
    assert one.status_code == 200
    assert one.get_json() == deleted


def test_receipts_remain_after_a_hard_delete(api):
    memory = save(api)
    api.post(f"/v1/memories/{memory['id']}/forget", json={"mode": "hard_delete"})
    response = api.get(f"/v1/memories/{memory['id']}/receipts")
    assert response.status_code == 200
    assert [r["mode"] for r in response.get_json()["items"]] == ["hard_delete"]


def test_receipts_of_an_unknown_memory_are_404(api):
    assert_problem(api.get(f"/v1/memories/{uuid.uuid4()}/receipts"), 404)


def test_someone_elses_receipt_is_404(api, stranger, db_session):
    user, memory = stranger
    receipt = memories.forget_memory(db_session, user.id, memory.id, mode="soft_delete",
                                     actor=Actor.of(user))
    db_session.commit()
    theirs = api.get(f"/v1/erasure-receipts/{receipt.marker_id}")
    unknown = api.get(f"/v1/erasure-receipts/{receipt.marker_id + 10_000}")
    assert_problem(theirs, 404)
    assert theirs.get_data() == unknown.get_data()


# -- the order of checks ----------------------------------------------------------------------

def test_no_key_is_401_with_www_authenticate(client):
    response = client.get("/v1/memories")
    assert_problem(response, 401)
    assert response.headers["WWW-Authenticate"] == "ApiKey"


@pytest.mark.parametrize("spoil", ["malformed", "unknown", "revoked", "expired", "inactive"])
def test_a_dead_key_is_401(client, db_session, owner, spoil):
    key, raw = new_key(db_session, owner, expires_at=datetime.now(UTC) + timedelta(days=1))
    if spoil == "malformed":
        raw = raw[:-1]
    elif spoil == "unknown":
        raw = raw[:-4] + ("AAAA" if not raw.endswith("AAAA") else "BBBB")
    elif spoil == "revoked":
        revoke_key(db_session, key, actor=Actor.of(owner))
    elif spoil == "expired":
        key.expires_at = datetime.now(UTC) - timedelta(seconds=1)
    else:
        owner.active = False
    db_session.commit()
    response = Api(client, raw).get("/v1/memories")
    assert_problem(response, 401)
    assert response.headers["WWW-Authenticate"] == "ApiKey"


@pytest.mark.parametrize("name", ["api_key", "API_KEY", "key", "apikey", "x-api-key",
                                  "X-Api-Key", "token"])
def test_a_key_in_the_url_is_refused_and_never_used(client, key, name):
    raw = key[1]
    response = client.get(f"/v1/memories?{name}={raw}")
    body = assert_problem(response, 400)
    assert body["detail"] == KEY_IN_URL


def test_a_key_in_the_url_is_refused_even_with_a_good_header(api, key):
    response = api.get(f"/v1/memories?api_key={key[1]}")
    assert assert_problem(response, 400)["detail"] == KEY_IN_URL


def test_a_refused_url_key_is_cut_from_what_the_access_log_reads(app, client, key):
    # gunicorn writes its access log from the environ it handed the app, after the
    # answer (the test client would hand the app a copy): call the app as gunicorn does.
    from werkzeug.test import EnvironBuilder

    url = f"/v1/memories?token={key[1]}"
    environ = EnvironBuilder(path=url, base_url="http://localhost").get_environ()
    environ["RAW_URI"] = environ["REQUEST_URI"] = url
    statuses = []
    b"".join(app(environ, lambda status, headers, *_: statuses.append(status)))
    assert statuses == ["400 BAD REQUEST"]
    logged = " ".join(str(environ[name]) for name in ("RAW_URI", "REQUEST_URI",
                                                      "QUERY_STRING"))
    assert key[1][:3] not in logged and logged.startswith("/v1/memories")


def _three_ids(api: Api, stranger) -> dict[str, str]:
    return {"own": save(api)["id"], "someone else's": str(stranger[1].id),
            "unknown": str(uuid.uuid4())}


@pytest.mark.parametrize("call", [
    ("read only", ("memory:read",), "PATCH", "", {"json": {"content": "x"}}),
    ("read only", ("memory:read",), "POST", "/restore", {}),
    ("no delete", ("memory:read", "memory:write"), "DELETE", "", {}),
    ("no redact", ("memory:read", "memory:delete"), "POST", "/forget",
     {"json": {"mode": "redact"}}),
    ("no hard delete", USER_SCOPES, "DELETE", "?mode=hard_delete", {}),
    ("no hard delete", USER_SCOPES, "POST", "/forget", {"json": {"mode": "hard_delete"}}),
    ("no read", ("memory:write",), "GET", "", {}),
], ids=lambda call: f"{call[0]} {call[2]}{call[3]}")
def test_a_missing_scope_is_403_whether_or_not_the_id_exists(client, db_session, owner, key,
                                                             stranger, call):
    _, scopes, method, suffix, kwargs = call
    ids = _three_ids(Api(client, key[1]), stranger)
    limited = Api(client, new_key(db_session, owner, scopes)[1])
    bodies = set()
    for id_ in ids.values():
        response = limited(method, f"/v1/memories/{id_}{suffix}", **kwargs)
        assert_problem(response, 403)
        bodies.add(response.get_data())
    assert len(bodies) == 1  # nothing tells whether the memory exists


@pytest.mark.parametrize("method,suffix,kwargs", [
    ("GET", "", {}),
    ("PATCH", "", {"json": {"content": "x"}}),
    ("DELETE", "", {}),
    ("DELETE", "?mode=hard_delete", {}),
    ("POST", "/forget", {"json": {"mode": "redact"}}),
    ("POST", "/restore", {}),
    ("GET", "/receipts", {}),
])
def test_someone_elses_id_is_404_byte_for_byte_like_an_unknown_one(api, stranger, method,
                                                                    suffix, kwargs):
    theirs = api(method, f"/v1/memories/{stranger[1].id}{suffix}", **kwargs)
    unknown = api(method, f"/v1/memories/{uuid.uuid4()}{suffix}", **kwargs)
    assert_problem(theirs, 404)
    assert theirs.get_data() == unknown.get_data()
    assert theirs.headers["Content-Type"] == unknown.headers["Content-Type"]


def test_someone_elses_memory_is_untouched(api, stranger, db_session):
    api.post(f"/v1/memories/{stranger[1].id}/forget", json={"mode": "hard_delete"})
    assert db_session.get(Memory, stranger[1].id).status == "active"


def test_an_id_that_is_not_a_uuid_is_a_problem_404(api):
    assert_problem(api.get("/v1/memories/not-a-uuid"), 404)


def test_restoring_a_redacted_memory_is_409(api):
    memory = save(api)
    api.post(f"/v1/memories/{memory['id']}/forget", json={"mode": "redact"})
    assert_problem(api.post(f"/v1/memories/{memory['id']}/restore"), 409)


def test_restoring_a_hard_deleted_memory_is_410(api):
    memory = save(api)
    api.delete(f"/v1/memories/{memory['id']}?mode=hard_delete")
    assert_problem(api.post(f"/v1/memories/{memory['id']}/restore"), 410)


def test_deleting_twice_is_409(api):
    memory = save(api)
    assert api.delete(f"/v1/memories/{memory['id']}").status_code == 200
    assert_problem(api.delete(f"/v1/memories/{memory['id']}"), 409)


# -- bodies ------------------------------------------------------------------------------------

BODY_CALLS = [("POST", "/v1/memories"), ("PATCH", "/v1/memories/{id}"),
              ("POST", "/v1/memories/search"), ("POST", "/v1/memories/{id}/forget"),
              ("POST", "/v1/memories/{id}/restore")]


@pytest.mark.parametrize("method,path", BODY_CALLS)
@pytest.mark.parametrize("kwargs", [
    {"data": '{"content": "x"}', "content_type": "text/plain"},
    {"data": {"content": "x", "mode": "soft_delete"}},  # a form
], ids=["text/plain", "form"])
def test_a_body_that_is_not_json_is_415(api, method, path, kwargs):
    memory = save(api)
    assert_problem(api(method, path.format(id=memory["id"]), **kwargs), 415)


@pytest.mark.parametrize("method,path", BODY_CALLS)
def test_malformed_json_is_400(api, method, path):
    memory = save(api)
    response = api(method, path.format(id=memory["id"]), data='{"content": "x",',
                   content_type="application/json")
    assert assert_problem(response, 400)["title"] == "Malformed JSON"


@pytest.mark.parametrize("body", ["[" * 100_000,
                                  '{"content": "x", "metadata": ' + '{"a": ' * 5000 + "1"
                                  + "}" * 5001], ids=["array", "metadata"])
def test_json_nested_past_the_parser_is_400(api, body):
    response = api.post("/v1/memories", data=body, content_type="application/json")
    assert assert_problem(response, 400)["detail"] == TOO_DEEP


@pytest.mark.parametrize("method,path,body,field", [
    ("POST", "/v1/memories", {"content": ""}, "content"),
    ("POST", "/v1/memories", {"content": "   "}, "content"),
    ("POST", "/v1/memories", {"content": "x", "metadata": ["not", "an", "object"]}, "metadata"),
    ("POST", "/v1/memories", {"content": "x", "metadata": "text"}, "metadata"),
    ("POST", "/v1/memories", {"content": "x", "source": "fax"}, "source"),
    ("POST", "/v1/memories", {"content": "x", "contnet": "typo"}, "contnet"),
    ("POST", "/v1/memories", {"content": 5}, "content"),
    ("POST", "/v1/memories", {"content": "x", "metadata": {"blob": "y" * 17_000}}, "metadata"),
    ("POST", "/v1/memories", ["content"], "body"),
    ("POST", "/v1/memories/search", {"query": "x", "k": 0}, "k"),
    ("POST", "/v1/memories/search", {"query": "x", "k": 51}, "k"),
    ("POST", "/v1/memories/search", {"query": "x", "k": "5"}, "k"),
    ("POST", "/v1/memories/{id}/forget", {"mode": "shred"}, "mode"),
    ("POST", "/v1/memories/{id}/forget", {}, "mode"),
    ("POST", "/v1/memories/{id}/forget",
     {"mode": "soft_delete", "replacement_content": "x"}, "replacement_content"),
    ("POST", "/v1/memories/{id}/forget", {"mode": "hard_delete", "metadata": {}}, "metadata"),
    ("PATCH", "/v1/memories/{id}", {}, "body"),
    ("PATCH", "/v1/memories/{id}", {"content": "  "}, "content"),
    ("POST", "/v1/memories/{id}/restore", {"metadata": 3}, "metadata"),
    ("DELETE", "/v1/memories/{id}?mode=shred", None, "mode"),
    ("GET", "/v1/memories?limit=ten", None, "limit"),
    ("GET", "/v1/memories?status=lost", None, "status"),
    ("GET", "/v1/memories?cursor=bm90LWEtY3Vyc29y", None, "cursor"),
    ("GET", "/v1/memories?cursor=%25%25%25", None, "cursor"),
])
def test_invalid_values_are_422_naming_the_field(api, method, path, body, field):
    memory = save(api)
    kwargs = {"json": body} if body is not None else {}
    response = api(method, path.format(id=memory["id"]), **kwargs)
    problem = assert_problem(response, 422)
    assert set(problem) == PROBLEM_KEYS | {"errors"}
    assert field in [error["field"] for error in problem["errors"]]
    assert all(set(error) == {"field", "detail"} and error["detail"]
               for error in problem["errors"])


def test_a_refused_change_changes_nothing(api, db_session):
    memory = save(api, "Original.")
    api.post(f"/v1/memories/{memory['id']}/forget",
             json={"mode": "soft_delete", "replacement_content": "x"})
    assert api.get(f"/v1/memories/{memory['id']}").get_json() == memory


# -- the rate limit, CSRF, headers, errors ------------------------------------------------------

def test_over_the_limit_is_429_with_retry_after_per_key(api, client, db_session, owner,
                                                        monkeypatch, app):
    monkeypatch.setitem(app.config, "API_RATE_LIMIT", "3 per hour")
    for _ in range(3):
        assert api.get("/v1/memories").status_code == 200
    response = api.get("/v1/memories")
    assert_problem(response, 429)
    assert 0 < int(response.headers["Retry-After"]) <= 3600
    other = Api(client, new_key(db_session, owner)[1])
    assert other.get("/v1/memories").status_code == 200  # counted per key
    for _ in range(5):
        assert api.get("/v1/openapi.json").status_code == 200  # the document is not limited


def test_a_forged_key_with_someone_elses_prefix_never_spends_their_allowance(
        api, key, monkeypatch, app, client):
    monkeypatch.setitem(app.config, "API_RATE_LIMIT", "3 per hour")
    forged = Api(client, key[0].prefix + "_" + "A" * 43)  # the prefix is public
    for _ in range(3):
        assert_problem(forged.get("/v1/memories"), 401)
    assert api.get("/v1/memories").status_code == 200


def test_failed_keys_are_counted_per_client_address_however_they_vary(
        api, monkeypatch, app, client):
    monkeypatch.setitem(app.config, "API_RATE_LIMIT", "3 per hour")
    fakes = [f"op_{n:012x}_{'B' * 43}" for n in range(4)]
    for fake in fakes[:3]:
        assert_problem(Api(client, fake).get("/v1/memories"), 401)
    assert_problem(Api(client, fakes[3]).get("/v1/memories"), 429)
    assert api.get("/v1/memories").status_code == 200  # a live key has its own count


@pytest.mark.parametrize("status,call", [
    (404, lambda api: api.get(f"/v1/memories/{uuid.uuid4()}")),
    (403, lambda api: api.post("/v1/memories", json={"content": "x"})),
])
def test_a_refused_call_still_records_the_keys_last_use(app, committed, queue, status,
                                                        call):
    """Really committed: a key that only probes (refused ids, missing scopes) must not
    look unused."""
    from dashboard.security import get_limiter

    owner = committed.user()
    key, raw = create_key(committed.session, owner=owner, name="probe",
                          scopes=["memory:read"], actor=Actor.of(owner))
    committed.session.commit()
    with app.app_context():
        get_limiter(app).reset()
    assert_problem(call(Api(app.test_client(), raw)), status)
    committed.session.expire_all()
    assert committed.session.scalar(
        select(ApiKey.last_used_at).where(ApiKey.id == key.id)) is not None


@pytest.mark.parametrize("method,path", [
    ("GET", "/v1/memories/not-a-uuid"), ("DELETE", "/v1/memories/not-a-uuid"),
    ("PATCH", "/v1/memories/not-a-uuid"), ("GET", "/v1/erasure-receipts/abc"),
])
def test_a_malformed_id_is_401_without_a_key_and_404_with_one(api, client, method, path):
    assert_problem(Api(client, None)(method, path, json={"content": "x"}), 401)
    assert_problem(api(method, path, json={"content": "x"}), 404)


@pytest.mark.parametrize("path,body", [
    ("/v1/memories/{id}", {"content": None}),
    ("/v1/memories/{id}/forget", {"mode": "soft_delete", "reason": None}),
    ("/v1/memories/{id}/forget", {"mode": "redact", "replacement_content": None}),
    ("/v1/memories/{id}/restore", {"reason": None}),
])
def test_a_json_null_for_an_optional_field_is_never_a_500(api, path, body):
    memory = save(api)
    method = "PATCH" if path.endswith("{id}") else "POST"
    response = api(method, path.format(id=memory["id"]), json=body)
    assert response.status_code < 500, response.get_data(as_text=True)
    if method == "PATCH":  # null content and no metadata: nothing to change
        assert_problem(response, 422)


def test_api_posts_need_no_csrf_token_while_forms_do(app, api, client):
    assert app.config["WTF_CSRF_ENABLED"] is True
    assert client.post("/auth/signout").status_code == 400  # a form without its token
    assert api.post("/v1/memories", json={"content": "No token."}).status_code == 201


def test_every_json_answer_says_no_store(api):
    memory = save(api)
    responses = [api.get("/v1/memories"), api.get(f"/v1/memories/{memory['id']}"),
                 api.get("/v1/memories/export"), api.get(f"/v1/memories/{uuid.uuid4()}"),
                 api.post("/v1/memories", json={}), api.get("/v1/openapi.json")]
    assert [r.headers.get("Cache-Control") for r in responses] == ["no-store"] * 6


def test_unknown_paths_and_methods_under_v1_are_problems(api):
    assert_problem(api.get("/v1/nothing-here"), 404)
    assert_problem(api("PUT", "/v1/memories"), 405)


def test_an_unexpected_error_is_a_problem_500_without_its_text(api, app, monkeypatch):
    memory = save(api)

    def broken(*args, **kwargs):
        raise RuntimeError(CANARY)

    monkeypatch.setattr(reached, "find_for", broken)
    monkeypatch.setitem(app.config, "PROPAGATE_TEST_ERRORS", False)
    response = api.get(f"/v1/memories/{memory['id']}")
    assert_problem(response, 500)
    assert CANARY not in response.get_data(as_text=True)


def test_a_response_that_drifted_from_its_model_is_still_answered_in_production(
        api, app, monkeypatch):
    memory = save(api)
    monkeypatch.setattr(reached, "described",
                        lambda _session, _reach, ms, **_: [{"id": str(m.id)} for m in ms])
    assert api.get(f"/v1/memories/{memory['id']}").status_code == 500  # tests: caught
    monkeypatch.setitem(app.config, "TESTING", False)
    response = api.get(f"/v1/memories/{memory['id']}")
    assert response.status_code == 200
    assert response.get_json() == {"id": memory["id"]}


def test_the_key_is_never_logged(api, client, key, caplog):
    caplog.set_level(logging.DEBUG)
    memory = save(api)
    api.get(f"/v1/memories/{memory['id']}")
    api.post("/v1/memories", json={"content": ""})
    client.get(f"/v1/memories?api_key={key[1]}")
    Api(client, key[1][:-1]).get("/v1/memories")
    secret = key[1][len("op_") + 13:]
    assert caplog.records  # something was logged at all
    assert secret not in caplog.text


def test_audit_events_of_api_calls_name_the_key_and_hold_no_content(api, key, db_session):
    head = db_session.scalar(select(func.coalesce(func.max(AuditEvent.seq), 0)))
    memory = save(api, f"{CANARY} one", metadata={"note": CANARY})
    mid = memory["id"]
    api.patch(f"/v1/memories/{mid}", json={"content": f"{CANARY} two"})
    api.delete(f"/v1/memories/{mid}?reason={CANARY}")
    api.post(f"/v1/memories/{mid}/restore", json={"metadata": {"n": CANARY}})
    api.post(f"/v1/memories/{mid}/forget", json={"mode": "redact",
                                                 "replacement_content": CANARY})
    api.post(f"/v1/memories/{mid}/forget", json={"mode": "hard_delete"})
    events = list(db_session.scalars(select(AuditEvent).where(
        AuditEvent.seq > head, AuditEvent.target_type == "memory",
        AuditEvent.target_id == mid).order_by(AuditEvent.seq)))
    assert [e.action for e in events] == ["memory.create", "memory.update",
                                          "memory.soft_delete", "memory.restore",
                                          "memory.redact", "memory.hard_delete"]
    assert {(e.actor_type, e.actor_id) for e in events} == {("api_key", str(key[0].id))}
    for event in events:
        assert CANARY not in json.dumps(event.details)


def test_a_successful_read_stamps_the_key_as_used(app, committed, queue):
    """Really committed: a read's commit is what keeps last_used_at."""
    from dashboard.security import get_limiter

    owner = committed.user()
    key, raw = new_key(committed.session, owner)
    committed.session.commit()
    with app.app_context():
        get_limiter(app).reset()
    assert Api(app.test_client(), raw).get("/v1/memories").status_code == 200
    committed.session.expire_all()
    assert committed.session.scalar(
        select(ApiKey.last_used_at).where(ApiKey.id == key.id)) is not None


# -- the OpenAPI document ------------------------------------------------------------------------

@pytest.fixture
def document(client) -> dict:
    response = client.get("/v1/openapi.json")
    assert response.status_code == 200
    return response.get_json()


def test_the_document_is_openapi_3_1_with_the_key_scheme(document):
    assert document["openapi"] == "3.1.0"
    assert document["components"]["securitySchemes"]["ApiKey"] | {"description": ""} == \
        {"type": "apiKey", "in": "header", "name": HEADER, "description": ""}
    assert document["security"] == [{"ApiKey": []}]
    assert document["paths"]["/v1/openapi.json"]["get"]["security"] == []


def test_every_v1_route_is_documented_and_nothing_else(app, document):
    routed = set()
    for rule in app.url_map.iter_rules():
        if rule.rule.startswith("/v1/"):
            path = re.sub(r"<(?:[^:>]+:)?([^>]+)>", r"{\1}", rule.rule)
            routed |= {(method, path) for method in rule.methods - {"HEAD", "OPTIONS"}}
    documented = {(method.upper(), path) for path, operations in document["paths"].items()
                  for method in operations}
    assert routed == documented
    assert len(routed) == 13


def test_each_operation_lists_its_problems_as_problem_json(document):
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            responses = operation["responses"]
            expected = {"400"}
            if path != "/v1/openapi.json":
                expected |= {"401", "403", "429", "503"}
            if "{memory_id}" in path:
                expected.add("404")
            if "requestBody" in operation:
                expected |= {"413", "415", "422"}
            if method in ("patch", "delete") or path.endswith(("/forget", "/restore")):
                expected |= {"409", "410"}
            problems = {code for code in responses if int(code) >= 400}
            assert expected <= problems, (method, path, expected - problems)
            for code in problems:
                assert list(responses[code]["content"]) == [PROBLEM], (method, path, code)
                assert responses[code]["content"][PROBLEM]["schema"]["$ref"] == \
                    "#/components/schemas/ProblemDetails"
            assert "401" not in responses or "WWW-Authenticate" in responses["401"]["headers"]
            assert "429" not in responses or "Retry-After" in responses["429"]["headers"]


def test_the_document_describes_the_bodies_and_queries(document):
    paths = document["paths"]
    body = paths["/v1/memories/{memory_id}/forget"]["post"]["requestBody"]
    assert body["content"]["application/json"]["schema"]["$ref"] == \
        "#/components/schemas/MemoryForgetRequest"
    assert paths["/v1/memories/{memory_id}/restore"]["post"]["requestBody"]["required"] \
        is False
    assert {p["name"] for p in paths["/v1/memories"]["get"]["parameters"]} == \
        {"limit", "cursor", "status", "team", "author", "app"}
    assert set(document["components"]["schemas"]["MemoryOut"]["properties"]) >= \
        {"owner", "attribution"}
    assert document["paths"]["/v1/memories/{memory_id}/share"]["post"]["requestBody"][
        "content"]["application/json"]["schema"]["$ref"] == \
        "#/components/schemas/ShareRequest"
    assert {p["name"] for p in paths["/v1/memories/{memory_id}"]["delete"]["parameters"]} == \
        {"memory_id", "mode", "reason"}
    assert set(document["components"]["schemas"]["MemoryForgetRequest"]["properties"]) == \
        {"mode", "reason", "replacement_content", "metadata"}


def test_db_session_is_untouched_by_the_document(db_session, document):
    # The document needs no key and no database: it is generated from the routes.
    assert db.session is db_session


def test_a_search_recall_is_not_sure_of_says_so(api, owner, db_session, monkeypatch):
    """Within the cut, beyond the sure distance: returned, each labelled possibly related,
    with a notice that nothing is clearly about the query (here every hashing hit is
    beyond a sure distance of 0.01)."""
    from dashboard.memory.embedders import HashingEmbedder

    monkeypatch.setattr(HashingEmbedder, "sure_distance", 0.01, raising=False)
    save(api, "Prefers aisle seats on long flights.")
    build(db_session, owner)
    response = api.post("/v1/memories/search", json={"query": "aisle seats", "k": 3})
    assert response.status_code == 200
    body = response.get_json()
    assert body["results"] and {h["relevance"] for h in body["results"]} == \
        {"possibly_related"}
    assert body["notice"] == memories.NOT_SURE


def test_a_key_that_may_only_write_or_forget_is_shown_no_content(api, client, db_session,
                                                                  owner):
    """Changing a memory is no way to read it: a key without memory:read gets the memory's
    id, state and attribution from PATCH, forget, restore and save, never its content or
    metadata (the reading key's memory holds a canary)."""
    canary = uuid.uuid4().hex
    memory = save(api, f"Door code {canary}.", metadata={"note": canary})
    _, writer = new_key(db_session, owner, ["memory:write"])
    _, forgetter = new_key(db_session, owner, ["memory:delete"])
    answers = [
        (200, Api(client, writer).patch(f"/v1/memories/{memory['id']}",
                                        json={"metadata": {}})),
        (200, Api(client, forgetter).post(f"/v1/memories/{memory['id']}/forget",
                                          json={"mode": "soft_delete"})),
        (200, Api(client, forgetter).post(f"/v1/memories/{memory['id']}/restore", json={})),
        (201, Api(client, writer).post("/v1/memories", json={"content": f"Also {canary}."})),
    ]
    for status, answer in answers:
        assert answer.status_code == status, answer.get_data(as_text=True)
        assert canary not in answer.get_data(as_text=True)
        shown = answer.get_json()
        shown = shown.get("memory", shown)
        assert (shown["content"], shown["metadata"]) == (None, None)
        assert shown["status"] in ("active", "deleted") and shown["attribution"]
    # The reading key still reads it whole.
    assert canary in api.get(f"/v1/memories/{memory['id']}").get_json()["content"]
