"""The OpenAPI document says exactly what the API accepts: for each request body below, the
document's own schema for it (validated with a JSON Schema 2020-12 validator) and the API
agree — what the document allows is never refused as invalid (a state may still refuse
it: 409), and what it forbids is refused (400 or 422); each case names its one status.
Nulls, integral numbers and a mode's own fields included."""

from __future__ import annotations

import jsonschema_rs
import pytest

from dashboard import saved_memories as memories
from dashboard.audit.services import Actor
from dashboard.saved_memories.openapi import HEADER
from tests.factories import ALL_SCOPES, make_key, make_user

MEMORY, FORGET, RESTORE = "/v1/memories/{id}", "/v1/memories/{id}/forget", \
    "/v1/memories/{id}/restore"
CASES = [
    # saving: metadata may be null (the same as leaving it out)
    ("POST", "/v1/memories", {"content": "x", "metadata": None}, 201),
    ("POST", "/v1/memories", {"content": "x", "metadata": {"a": [1]}}, 201),
    ("POST", "/v1/memories", {"content": "x", "metadata": "a string"}, 422),
    ("POST", "/v1/memories", {"content": "x", "source": "someone"}, 422),
    ("POST", "/v1/memories", {"content": "a\u0000b"}, 400),
    ("POST", "/v1/memories", {"content": ""}, 422),
    # recall: k is a whole number, written 43 or 43.0; never a string, a bool, 43.5
    ("POST", "/v1/memories/search", {"query": "seats", "k": 43}, 200),
    ("POST", "/v1/memories/search", {"query": "seats", "k": 43.0}, 200),
    ("POST", "/v1/memories/search", {"query": "seats", "k": 43.5}, 422),
    ("POST", "/v1/memories/search", {"query": "seats", "k": "5"}, 422),
    ("POST", "/v1/memories/search", {"query": "seats", "k": True}, 422),
    ("POST", "/v1/memories/search", {"query": "seats", "k": 51}, 422),
    # an edit: content, metadata or both, at least one not null
    ("PATCH", MEMORY, {"content": "new text", "metadata": None}, 200),
    ("PATCH", MEMORY, {"content": None, "metadata": {"a": 1}}, 200),
    ("PATCH", MEMORY, {"content": None, "metadata": None}, 422),
    ("PATCH", MEMORY, {}, 422),
    ("PATCH", MEMORY, {"content": "x", "extra": 1}, 422),
    # a forget: replacement text for redact only, metadata not with hard_delete
    ("POST", FORGET, {"mode": "redact", "replacement_content": "[gone]"}, 200),
    ("POST", FORGET, {"mode": "soft_delete", "replacement_content": "[gone]"}, 422),
    ("POST", FORGET, {"mode": "hard_delete", "replacement_content": "[gone]"}, 422),
    ("POST", FORGET, {"mode": "hard_delete", "replacement_content": None, "metadata": None}, 200),
    ("POST", FORGET, {"mode": "hard_delete", "metadata": {"a": 1}}, 422),
    ("POST", FORGET, {"mode": "soft_delete", "metadata": {"a": 1}, "reason": None}, 200),
    ("POST", FORGET, {"mode": "forget it"}, 422),
    # a restore: every field optional, null alike (409: the memory is not deleted)
    ("POST", RESTORE, {"reason": None, "metadata": None}, 409),
    ("POST", RESTORE, {"reason": 7}, 422),
]


@pytest.fixture
def document(client):
    return client.get("/v1/openapi.json").get_json()


def body_schema(document: dict, method: str, path: str) -> jsonschema_rs.Validator:
    template = path.replace("{id}", "{memory_id}")
    ref = document["paths"][template][method.lower()]["requestBody"]["content"][
        "application/json"]["schema"]
    return jsonschema_rs.Draft202012Validator({**ref, "components": document["components"]})


@pytest.mark.parametrize("method,path,body,status", CASES,
                         ids=[f"{m} {p} {b}" for m, p, b, _ in CASES])
def test_the_document_and_the_api_agree_on_what_a_body_may_be(client, db_session, queue,
                                                              document, method, path, body,
                                                              status):
    owner = make_user(db_session)
    _, raw = make_key(db_session, owner, scopes=ALL_SCOPES)
    memory = memories.save_memory(db_session, owner=owner, content="Prefers aisle seats.",
                                  actor=Actor.of(owner)).memory
    db_session.commit()
    allowed = body_schema(document, method, path).is_valid(body)
    response = client.open(path.replace("{id}", str(memory.id)), method=method, json=body,
                           headers={HEADER: raw})
    assert response.status_code == status, response.get_json()
    # What the document allows is refused only by the memory's state (409), never as
    # invalid; what it forbids is refused as invalid.
    assert allowed == (status < 400 or status == 409)
