"""Every ``/v1`` route, walked from the app's URL map, needs exactly the scope the product
spec gives it: a key holding every scope but that one is a 403 naming it, a key
holding only that one is served. The table below is written from the spec, not read
from the code: a route without a case, or a lowered entry in the services' table, fails."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import pytest

from dashboard import saved_memories as memories
from dashboard.access import reach_of
from dashboard.audit.services import Actor
from dashboard.saved_memories.openapi import HEADER, PROBLEM
from tests.factories import ALL_SCOPES, make_key, make_team, make_user

MEMORY = "/v1/memories/<memory_id:memory_id>"
RECEIPT = "/v1/erasure-receipts/<marker_id>"
PUBLIC = {("GET", "/v1/openapi.json")}  # the document: no key at all
TEAM = "scoped-team"


@dataclass(frozen=True)
class Case:
    method: str
    rule: str
    scope: str  # what the spec says it needs
    status: int  # its answer when served
    target: str | None = None  # what the path names: "active", "deleted", "receipt"
    request: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.method} {self.rule} {self.request or ''}".strip()


def forget_cases(scope: str, mode: str) -> list[Case]:
    return [Case("DELETE", MEMORY, scope, 200, "active", {"query_string": {"mode": mode}}),
            Case("POST", f"{MEMORY}/forget", scope, 200, "active", {"json": {"mode": mode}})]


CASES = [
    Case("POST", "/v1/memories", "memory:write", 201, request={"json": {"content": "Tea."}}),
    Case("GET", "/v1/memories", "memory:read", 200),
    Case("POST", "/v1/memories/search", "memory:read", 200, request={"json": {"query": "tea"}}),
    Case("GET", "/v1/memories/export", "memory:read", 200),
    Case("GET", MEMORY, "memory:read", 200, "active"),
    Case("PATCH", MEMORY, "memory:write", 200, "active", {"json": {"content": "Green tea."}}),
    Case("DELETE", MEMORY, "memory:delete", 200, "active"),  # soft_delete, the default
    *forget_cases("memory:delete", "soft_delete"),
    *forget_cases("memory:redact", "redact"),
    *forget_cases("memory:hard_delete", "hard_delete"),
    Case("POST", f"{MEMORY}/restore", "memory:delete", 200, "deleted"),
    # Sharing to a team the key acts for (the owner a member who may write there).
    Case("POST", f"{MEMORY}/share", "memory:write", 201, "active",
         {"json": {"team": TEAM}}),
    Case("GET", f"{MEMORY}/receipts", "memory:read", 200, "deleted"),
    Case("GET", RECEIPT, "memory:read", 200, "receipt"),
]


@pytest.fixture
def owner(db_session):
    """Someone in a team (a member) whom every key here may act for."""
    user = make_user(db_session)
    make_team(db_session, make_user(db_session), slug=TEAM, members={user: "member"})
    return user


def key_holding(session, owner, scopes: list[str]) -> str:
    """A key with exactly ``scopes`` (memory:hard_delete set as an admin's grant would),
    acting for the owner's team."""
    key, raw = make_key(session, owner, scopes=["memory:read"],
                        team_ids=[*reach_of(session, owner.id).seats])
    key.scopes = list(scopes)
    session.commit()  # a refused call rolls back: the key must outlive it
    return raw


def path_for(session, owner, case: Case) -> str:
    if case.target is None:
        return case.rule
    actor = Actor.of(owner)
    memory = memories.save_memory(session, owner=owner, content="Black tea.",
                                  actor=actor).memory
    value = str(memory.id)
    if case.target in ("deleted", "receipt"):
        receipt = memories.forget_memory(session, owner.id, memory.id, mode="soft_delete",
                                         actor=actor)
        value = str(receipt.marker_id) if case.target == "receipt" else value
    session.commit()
    return re.sub(r"<[^>]+>", value, case.rule)


def test_every_v1_route_has_a_case(app):
    routes = {(method, rule.rule) for rule in app.url_map.iter_rules()
              if rule.endpoint.startswith("api.")
              for method in rule.methods - {"HEAD", "OPTIONS"}}
    assert routes == {(case.method, case.rule) for case in CASES} | PUBLIC


def test_the_document_needs_no_key(client):
    assert client.get("/v1/openapi.json").status_code == 200


def test_the_document_says_what_each_route_needs(client):
    paths = client.get("/v1/openapi.json").get_json()["paths"]
    for case in CASES:
        path = re.sub(r"<(?:[^:>]+:)?([^>]+)>", r"{\1}", case.rule)
        description = paths[path][case.method.lower()]["description"]
        mode = {**case.request.get("query_string", {}), **case.request.get("json", {})}.get(
            "mode", "soft_delete" if case.method == "DELETE" else None)  # DELETE's default
        assert (f"{mode} {case.scope}" if mode else f"Needs {case.scope}.") in description, \
            (case, description)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_each_route_needs_exactly_its_scope(client, db_session, owner, queue, case):
    path = path_for(db_session, owner, case)
    without = key_holding(db_session, owner, [s for s in ALL_SCOPES if s != case.scope])
    refused = client.open(path, method=case.method, headers={HEADER: without},
                          **case.request)
    assert refused.status_code == 403, refused.get_data(as_text=True)
    assert refused.mimetype == PROBLEM
    assert case.scope in refused.get_json()["detail"]

    only = key_holding(db_session, owner, [case.scope])
    served = client.open(path, method=case.method, headers={HEADER: only}, **case.request)
    assert served.status_code == case.status, served.get_data(as_text=True)
