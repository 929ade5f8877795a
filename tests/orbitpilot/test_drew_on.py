"""What a reply drew on: recorded (ids and distances, no text), listed under the reply with
links, "forget this" and "not relevant", gone once the item is forgotten, and never in a
log; a reply that drew on memory is remembered by the turn alone."""

from __future__ import annotations

import logging
import os
import uuid

import pytest
from sqlalchemy import select

from dashboard.audit.services import Actor
from dashboard.blinks.models import Blink
from dashboard.memory import get_embedder
from dashboard.memory.embedders import minilm_available
from dashboard.memory.pipeline import run_memory_build
from dashboard.orbitpilot.marks import catch_reply
from dashboard.orbitpilot.models import Message, ReplyRecall
from dashboard.orbitpilot.source import extract_chat_pairs
from dashboard.saved_memories import forget_memory
from dashboard.sources import BLINKS, CHAT_HISTORY, SAVED
from tests.factories import make_blink, make_conversation, make_memory, make_plan, make_user
from tests.orbitpilot.conftest import send, token
from tests.orbitpilot.dom import parse

NOT_RELEVANT = "/orbitpilot/drew-on/not-relevant/"


def _world(db_session, embedder_name: str, *, memory: str, blink: str | None,
           pair: tuple[str, str]):
    """A saved memory, a Blink (``None``: the pair's reply, caught), a chat pair; built."""
    user = make_user(db_session, plan=make_plan(db_session, cap=5))
    saved = make_memory(db_session, user, memory)
    conversation, messages = make_conversation(db_session, user, [pair], title="Earlier")
    if blink is None:
        caught = db_session.get(Blink, catch_reply(db_session, user_id=user.id,
                                                   message_id=str(messages[1].id)).blink_id)
    else:
        caught = make_blink(db_session, user, blink, title="Caught reply")
    run_memory_build(user, "full", session=db_session, embedder=get_embedder(embedder_name))
    return user, saved, caught, conversation


def _items(page_html: str, reply_id: int) -> list[tuple[str, str, str]]:
    """(source, item id, link) of each item listed under the reply."""
    reply = parse(page_html).find(id=f"m{reply_id}")
    assert reply is not None
    return [(li.attrs["data-source"], li.attrs["data-item-id"], li.find("a").attrs["href"])
            for li in reply.find_all(data_op_drew_on_item=True)]


def test_a_reply_lists_what_it_drew_on_with_links_and_forgetting_removes_it(
        client, db_session, auth, caplog):
    canary = uuid.uuid4().hex
    user, saved, caught, conversation = _world(
        db_session, "hashing", memory=f"Prefers aisle seats on long flights {canary}",
        blink=f"Book the aisle seat early {canary}",
        pair=(f"Which aisle seat did I get? {canary}", "Row 12, aisle."))
    auth.login(user.email)
    caplog.set_level(logging.DEBUG)
    body = send(client, f"aisle seat {canary}").get_json()
    reply_id = body["reply"]["id"]

    listed = {item["source"]: item for item in body["drew_on"]["items"]}
    assert set(listed) == {SAVED, BLINKS, CHAT_HISTORY}
    assert listed[SAVED]["item_id"] == str(saved.id)
    assert listed[BLINKS]["item_id"] == str(caught.id)
    assert listed[CHAT_HISTORY]["item_id"] == f"{conversation.id}:0"
    # Recorded in the user's own data: ids, ranks and distances, no text.
    rows = db_session.scalars(select(ReplyRecall).where(
        ReplyRecall.message_id == reply_id).order_by(ReplyRecall.rank)).all()
    assert [r.source_key for r in rows] == [i["source"] for i in body["drew_on"]["items"]]
    assert all(r.user_id == user.id and 0 <= r.distance < 1 for r in rows)

    page = client.get(body["conversation_url"]).get_data(as_text=True)
    items = _items(page, reply_id)
    assert {source for source, _, _ in items} == {SAVED, BLINKS, CHAT_HISTORY}
    for source, _item_id, href in items:
        shown = client.get(href)
        assert shown.status_code == 200, (source, href)
        if source != CHAT_HISTORY:  # the pair's link is the conversation itself
            assert canary in shown.get_data(as_text=True), (source, href)
    assert f"m{db_session.scalar(select(Message.id).where(Message.conversation_id == conversation.id, Message.role == 'user'))}" in dict(  # noqa: E501
        (s, h) for s, _, h in items)[CHAT_HISTORY]

    # Forgotten (its chunks go at once): it leaves the list, the others stay.
    forget_memory(db_session, user.id, saved.id, mode="soft_delete", actor=Actor.of(user),
                  reason="")
    db_session.commit()
    page = client.get(body["conversation_url"]).get_data(as_text=True)
    assert {s for s, _, _ in _items(page, reply_id)} == {BLINKS, CHAT_HISTORY}

    # "Not relevant" takes one item off that reply's list.
    blink_row = next(r for r in rows if r.source_key == BLINKS)
    response = client.post(NOT_RELEVANT, data={"recall_id": blink_row.id,
                                               "csrf_token": token(client)})
    assert response.status_code == 303
    page = client.get(body["conversation_url"]).get_data(as_text=True)
    assert {s for s, _, _ in _items(page, reply_id)} == {CHAT_HISTORY}
    assert canary not in caplog.text


def test_not_relevant_is_the_owners_alone_and_a_post(client, db_session, auth):
    user, *_ = _world(db_session, "hashing", memory="Likes green tea", blink="tea notes",
                      pair=("tea?", "green"))
    auth.login(user.email)
    body = send(client, "green tea").get_json()
    recall_id = body["drew_on"]["items"][0]["id"]
    assert client.get(f"{NOT_RELEVANT}?recall_id={recall_id}").status_code == 405
    other = make_user(db_session, plan=make_plan(db_session, cap=5))
    db_session.commit()
    auth.logout()
    auth.login(other.email)
    refused = client.post(NOT_RELEVANT, data={"recall_id": recall_id, "format": "json",
                                              "csrf_token": token(client)})
    assert refused.status_code == 404
    assert db_session.get(ReplyRecall, recall_id).not_relevant is False


def test_a_reply_that_drew_on_memory_is_remembered_by_the_turn_alone_a_question_not_at_all(
        client, db_session, auth):
    """The built-in responder's replies hold nothing of their own either; a turn that only
    asks, answered so, is no fact (its index is kept: the next pair stays ``:2``)."""
    user, saved, *_ = _world(db_session, "hashing", memory="Prefers aisle seats",
                             blink="x", pair=("y", "z"))
    auth.login(user.email)
    drew = send(client, "Aisle seats on the night train, please.").get_json()
    asked = send(client, "aisle seats?", drew["conversation_id"]).get_json()
    plain = send(client, "zzzqqq", drew["conversation_id"]).get_json()
    assert drew["drew_on"]["memory_items"] >= 1 and asked["drew_on"]["memory_items"] >= 1
    assert plain["drew_on"]["memory_items"] == 0
    records = {r.source_id: r.text for r in extract_chat_pairs(
        db_session, user.id, [drew["conversation_id"]])}
    pair = drew["conversation_id"]
    assert records == {f"{pair}:0": "User: Aisle seats on the night train, please.",
                       f"{pair}:2": "User: zzzqqq"}
    assert "Prefers aisle seats" in asked["reply"]["content"]  # it answered from recall


@pytest.mark.skipif(
    not minilm_available() and os.environ.get("CI", "").lower() not in {"1", "true"},
    reason="the ml extra (all-MiniLM-L6-v2) is not installed")
def test_with_the_default_embedder_a_paraphrase_draws_on_the_saved_memory(
        app, client, db_session, auth, monkeypatch, caplog):
    monkeypatch.setitem(app.config, "EMBEDDER", "minilm")
    user, saved, caught, conversation = _world(
        db_session, "minilm", memory="Prefers aisle seats on long flights.",
        blink=None, pair=("I always pick the aisle on planes.",
                          "Noted: on planes you like to sit by the aisle."))
    auth.login(user.email)
    caplog.set_level(logging.DEBUG)
    body = send(client, "what do I like on planes").get_json()
    listed = [(i["source"], i["item_id"]) for i in body["drew_on"]["items"]]
    assert (SAVED, str(saved.id)) in listed
    assert {source for source, _ in listed} == {SAVED, BLINKS, CHAT_HISTORY}
    page = client.get(body["conversation_url"]).get_data(as_text=True)
    for _, _, href in _items(page, body["reply"]["id"]):
        assert client.get(href).status_code == 200
    forget_memory(db_session, user.id, saved.id, mode="soft_delete", actor=Actor.of(user),
                  reason="")
    db_session.commit()
    page = client.get(body["conversation_url"]).get_data(as_text=True)
    assert {s for s, _, _ in _items(page, body["reply"]["id"])} == {BLINKS, CHAT_HISTORY}
    assert "aisle" not in caplog.text
    nothing = send(client, "what is the boiling point of tungsten",
                   body["conversation_id"]).get_json()
    assert nothing["drew_on"]["items"] == []
    assert "I found nothing in your memory" in nothing["reply"]["content"]


def test_an_item_recall_was_not_sure_of_is_labelled_possibly_related(
        client, db_session, auth, monkeypatch):
    """Within the cut, beyond the sure distance: listed, recorded and shown as possibly
    related (here every hashing hit is beyond a sure distance of 0.01)."""
    from dashboard.memory.embedders import HashingEmbedder

    monkeypatch.setattr(HashingEmbedder, "sure_distance", 0.01, raising=False)
    user, saved, _, _ = _world(db_session, "hashing", memory="Prefers aisle seats on trains",
                               blink="Packing list for Lisbon", pair=("Hello", "Hi there."))
    auth.login(user.email)
    body = send(client, "aisle seats on planes?").get_json()
    (item,) = [i for i in body["drew_on"]["items"] if i["source"] == SAVED]
    assert item["relevance"] == "possibly_related"
    row = db_session.scalars(select(ReplyRecall).where(
        ReplyRecall.message_id == body["reply"]["id"], ReplyRecall.source_key == SAVED)).one()
    assert row.relevance == "possibly_related"
    page = parse(client.get(body["conversation_url"]).get_data(as_text=True))
    (listed,) = [li for li in page.find(id=f"m{body['reply']['id']}").find_all(
        data_op_drew_on_item=True) if li.attrs["data-source"] == SAVED]
    assert listed.find(data_op_relevance=True).normalized_text == "possibly related"
