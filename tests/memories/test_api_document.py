"""The OpenAPI document says exactly what the API accepts: for each request body below, the
document's own schema for it (validated with a JSON Schema 2020-12 validator) and the API
agree — what the document allows is never refused as invalid (a state may still refuse
it: 409), and what it forbids is refused (400 or 422). Nulls, integral numbers and a
mode's own fields included."""

from __future__ import annotations

import jsonschema_rs
import pytest

from dashboard.audit.services import Actor
from dashboard.memories import services
from dashboard.memories.openapi import HEADER
from tests.factories import ALL_SCOPES, make_key, make_user

MEMORY, FORGET, RESTORE = "/v1/memories/{id}", "/v1/memories/{id}/forget", \
    "/v1/memories/{id}/restore"
CASES = [
    # saving: metadata may be null (the same as leaving it out)
    ("POST", "/v1/memories", {"content": "x", "metadata": None}),
    ("POST", "/v1/memories", {"content": "x", "metadata": {"a": [1]}}),
    ("POST", "/v1/memories", {"content": "x", "metadata": "a string"}),
    ("POST", "/v1/memories", {"content": "x", "source": "someone"}),
    ("POST", "/v1/memories", {"content": "a\u0000b"}),
    ("POST", "/v1/memories", {"content": ""}),
    # recall: k is a whole number, written 43 or 43.0; never a string, a bool, 43.5
    ("POST", "/v1/memories/search", {"query": "seats", "k": 43}),
    ("POST", "/v1/memories/search", {"query": "seats", "k": 43.0}),
    ("POST", "/v1/memories/search", {"query": "seats", "k": 43.5}),
    ("POST", "/v1/memories/search", {"query": "seats", "k": "5"}),
    ("POST", "/v1/memories/search", {"query": "seats", "k": True}),
    ("POST", "/v1/memories/search", {"query": "seats", "k": 51}),
    # an edit: content, metadata or both, at least one not null
    ("PATCH", MEMORY, {"content": "new text", "metadata": None}),
    ("PATCH", MEMORY, {"content": None, "metadata": {"a": 1}}),
    ("PATCH", MEMORY, {"content": None, "metadata": None}),
    ("PATCH", MEMORY, {}),
    ("PATCH", MEMORY, {"content": "x", "extra": 1}),
    # a forget: replacement text for redact only, metadata not with hard_delete
    ("POST", FORGET, {"mode": "redact", "replacement_content": "[gone]"}),
    ("POST", FORGET, {"mode": "soft_delete", "replacement_content": "[gone]"}),
    ("POST", FORGET, {"mode": "hard_delete", "replacement_content": "[gone]"}),
    ("POST", FORGET, {"mode": "hard_delete", "replacement_content": None, "metadata": None}),
    ("POST", FORGET, {"mode": "hard_delete", "metadata": {"a": 1}}),
    ("POST", FORGET, {"mode": "soft_delete", "metadata": {"a": 1}, "reason": None}),
    ("POST", FORGET, {"mode": "forget it"}),
    # a restore: every field optional, null alike (409: the memory is not deleted)
    ("POST", RESTORE, {"reason": None, "metadata": None}),
    ("POST", RESTORE, {"reason": 7}),
]


@pytest.fixture
def document(client):
    return client.get("/v1/openapi.json").get_json()


def body_schema(document: dict, method: str, path: str) -> jsonschema_rs.Validator:
    template = path.replace("{id}", "{memory_id}")
    ref = document["paths"][template][method.lower()]["requestBody"]["content"][
        "application/json"]["schema"]
    return jsonschema_rs.Draft202012Validator({**ref, "components": document["components"]})


@pytest.mark.parametrize("method,path,body", CASES,
                         ids=[f"{m} {p} {b}" for m, p, b in CASES])
def test_the_document_and_the_api_agree_on_what_a_body_may_be(client, db_session, queue,
                                                              document, method, path, body):
    owner = make_user(db_session)
    _, raw = make_key(db_session, owner, scopes=ALL_SCOPES)
    memory = services.save_memory(db_session, owner=owner, content="Prefers aisle seats.",
                                  actor=Actor.of(owner)).memory
    db_session.commit()
    allowed = body_schema(document, method, path).is_valid(body)
    response = client.open(path.replace("{id}", str(memory.id)), method=method, json=body,
                           headers={HEADER: raw})
    if allowed:
        assert response.status_code in (200, 201, 409), response.get_json()
    else:
        assert response.status_code in (400, 422), response.get_json()
