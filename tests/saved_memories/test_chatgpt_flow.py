"""The "ChatGPT user" flow end to end (issue 9): a connector saves a preference through
the API, a real worker process runs the build it requested, a reply in a new conversation
draws on it; the connector forgets it, and the very next reply does not — no build in
between. Everything is committed for real (the worker is another process)."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import select

from dashboard.audit.services import Actor
from dashboard.extensions import db
from dashboard.memory import MemoryBuild, MemoryChunk
from dashboard.saved_memories.keys import create_key
from dashboard.sources import SAVED
from tests.conftest import AuthActions, csrf_from
from tests.orbitpilot import recording
from tests.workers import run_worker

pytestmark = pytest.mark.processes  # real processes or servers: slow


@pytest.fixture
def connector(app, committed, queue, monkeypatch):
    """A signed-in user with an API key their ChatGPT connector uses."""
    monkeypatch.setitem(app.config, "ORBITPILOT_RESPONDER",
                        "tests.orbitpilot.recording:recording_responder")
    user = committed.user()
    key, secret = create_key(committed.session, owner=user, name="ChatGPT connector",
                             scopes=["memory:read", "memory:write", "memory:delete"],
                             actor=Actor.of(user))
    committed.session.commit()
    return user, secret


def ask(client, text: str) -> dict:
    """A message in a new conversation, as the user types it in the chat."""
    token = csrf_from(client, "/orbitpilot/")
    response = client.post("/orbitpilot/send", data={"message": text, "csrf_token": token},
                           headers={"Accept": "application/json"})
    assert response.status_code == 201, response.get_data(as_text=True)
    return response.get_json()


# Shares "units" with the preference: the test embedder is lexical, and a question with
# nothing in common with it is, rightly, no match.
QUESTION = "Which units should you use when you give me distances?"


def saved_hits(context) -> list[str]:
    return [hit.content for hit in context.memory if hit.source_key == SAVED]


def test_save_build_recall_forget_not_recalled(app, connector):
    user, secret = connector
    preference = f"I prefer metric units and answers under five lines ({uuid.uuid4().hex})"
    api = app.test_client()
    headers = {"X-API-Key": secret}

    saved = api.post("/v1/memories", json={"content": preference, "source": "chatgpt"},
                     headers=headers)
    assert saved.status_code == 201, saved.get_data(as_text=True)
    body = saved.get_json()
    memory_id = body["memory"]["id"]
    assert body["remembered"] is True
    build_id = body["build"]["id"]

    run_worker(app)  # a real worker process runs the quick update the save requested
    with app.app_context():
        build = db.session.get(MemoryBuild, build_id)
        assert build.status == "succeeded"
        assert db.session.scalar(select(MemoryChunk.id).where(
            MemoryChunk.user_id == user.id, MemoryChunk.source_id == memory_id)) is not None
        db.session.remove()

    chat = app.test_client()
    assert AuthActions(chat).login(user.email).status_code == 302
    recording.RECORDED.clear()
    first = ask(chat, QUESTION)
    assert saved_hits(recording.RECORDED[-1]) == [preference]
    assert preference in first["reply"]["content"]  # the answer quotes it

    forgotten = api.delete(f"/v1/memories/{memory_id}", headers=headers)
    assert forgotten.status_code == 200, forgotten.get_data(as_text=True)
    assert forgotten.get_json()["receipt"]["removed"]["chunks"] >= 1

    second = ask(chat, QUESTION)
    assert saved_hits(recording.RECORDED[-1]) == []
    assert preference not in second["reply"]["content"]
    with app.app_context():
        # Not recalled because its chunks are gone, not because a build ran meanwhile.
        assert db.session.scalars(select(MemoryBuild.id).where(
            MemoryBuild.user_id == user.id, MemoryBuild.id > build_id,
            MemoryBuild.status != "queued")).all() == []
        db.session.remove()
