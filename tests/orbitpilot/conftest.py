"""What the chat tests share: users on plans that do or do not remember chat history, a
recording responder, and small helpers for the chat's forms."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from dashboard.orbitpilot.models import Message

# The browser, the live server and ``page`` for test_chat_browser.py.
from tests.browser.conftest import base_url, browser, live_app, page  # noqa: F401
from tests.conftest import csrf_from
from tests.factories import make_plan, make_user
from tests.orbitpilot import recording

CHAT_PAGE = "/orbitpilot/"
TOGGLE = "/orbitpilot/message/remember/"
CATCH = "/orbitpilot/message/catch/"
SEND = "/orbitpilot/send"


@pytest.fixture
def recorded(app, monkeypatch):
    """Every ResponderContext the chat hands its responder, in order."""
    monkeypatch.setitem(app.config, "ORBITPILOT_RESPONDER",
                        "tests.orbitpilot.recording:recording_responder")
    recording.RECORDED.clear()
    yield recording.RECORDED
    recording.RECORDED.clear()


@pytest.fixture
def remembering_user(db_session):
    """A user whose plan includes chat history (cap 4: nothing evicts it)."""
    return make_user(db_session, plan=make_plan(db_session, cap=4))


@pytest.fixture
def signed_in(client, auth, remembering_user):
    auth.login(remembering_user.email)
    return remembering_user


def token(client, path: str = CHAT_PAGE) -> str:
    return csrf_from(client, path)


def send(client, text: str, conversation_id=None, *, as_json: bool = True, csrf=None):
    data = {"message": text, "csrf_token": csrf or token(client)}
    if conversation_id is not None:
        data["conversation_id"] = str(conversation_id)
    if as_json:
        data["format"] = "json"
    return client.post(SEND, data=data)


def toggle(client, message_id, *, as_json: bool = True, csrf: str | None = ""):
    data = {"message_id": str(message_id)}
    if csrf is not None:
        data["csrf_token"] = csrf or token(client)
    if as_json:
        data["format"] = "json"
    return client.post(TOGGLE, data=data)


def fresh_message(db_session, message_id: int) -> Message:
    db_session.expire_all()
    return db_session.scalars(select(Message).where(Message.id == message_id)).one()
