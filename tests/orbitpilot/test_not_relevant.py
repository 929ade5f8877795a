"""An item marked "not relevant" under a reply is demoted in that person's later searches:
the chat's recall and their API search rank it after every hit not marked, never as
relevant, for one query more."""

from __future__ import annotations

from dataclasses import dataclass

from dashboard.demotions import demote, widened
from dashboard.memory import POSSIBLY_RELATED, RELEVANT, get_embedder, search_memory
from dashboard.orbitpilot.marks import mark_not_relevant, not_relevant_items
from dashboard.orbitpilot.recall import memory_hits
from dashboard.orbitpilot.replies import send_message
from dashboard.orbitpilot.responder import BuiltinResponder
from dashboard.saved_memories.openapi import HEADER
from tests.factories import build, make_key, make_memory, make_plan, make_user
from tests.orbitpilot.conftest import token

NOT_RELEVANT = "/orbitpilot/drew-on/not-relevant/"
QUESTION = "Which tea do I like in the morning?"
# The nearer one first (it shares more of the question's words).
NEAR = "I like green tea in the morning."
FAR = "Morning tea: oolong."


def _person(db_session):
    user = make_user(db_session, plan=make_plan(db_session, cap=5))
    near, far = make_memory(db_session, user, NEAR), make_memory(db_session, user, FAR)
    build(db_session, user, "full")
    return user, str(near.id), str(far.id)


def _ask(db_session, user):
    return send_message(db_session, responder=BuiltinResponder(), user_id=user.id,
                        text=QUESTION, embedder=get_embedder("hashing"))


def test_after_marking_the_same_question_ranks_another_item_first(
        client, auth, db_session):
    user, near, far = _person(db_session)
    first = _ask(db_session, user)
    assert [item.source_id for item in first.reply.drew_on] == [near, far]
    assert first.reply.content == (f"From your saved memory: \u201c{NEAR}\u201d\n"
                                   f"Also, from your saved memory: \u201c{FAR}\u201d")
    db_session.commit()
    auth.login(user.email)
    marked = client.post(NOT_RELEVANT, data={"recall_id": first.reply.drew_on[0].recall_id,
                                             "csrf_token": token(client)})
    assert marked.status_code == 303

    again = _ask(db_session, user)
    assert [item.source_id for item in again.reply.drew_on] == [far, near]
    # Answered from the other item; the marked one is never quoted as sure.
    assert again.reply.content == f"From your saved memory: \u201c{FAR}\u201d"
    hits = memory_hits(db_session, user.id, QUESTION, embedder=get_embedder("hashing"))
    assert [(h.source_id, h.relevance) for h in hits] == [
        (far, RELEVANT), (near, POSSIBLY_RELATED)]


def test_the_demotion_costs_one_query_however_many_items_are_marked(
        db_session, count_queries):
    user, near, far = _person(db_session)
    embedder = get_embedder("hashing")

    def costs() -> tuple[int, int]:
        with count_queries() as alone:
            search_memory(db_session, [user.id], QUESTION, 3, embedder=embedder)
        with count_queries() as chat:
            memory_hits(db_session, user.id, QUESTION, embedder=embedder)
        return alone.count, chat.count

    unmarked = costs()
    assert unmarked[1] == unmarked[0] + 1
    for item in _ask(db_session, user).reply.drew_on:
        mark_not_relevant(db_session, user_id=user.id, recall_id=str(item.recall_id))
    assert not_relevant_items(db_session, user.id) == {
        (user.id, "xmemo.saved", near), (user.id, "xmemo.saved", far)}
    assert costs() == unmarked


def test_the_persons_api_search_ranks_the_marked_item_last(client, db_session):
    user, near, far = _person(db_session)
    _, raw = make_key(db_session, user)
    db_session.commit()

    def searched() -> list[str]:
        response = client.post("/v1/memories/search", headers={HEADER: raw},
                               json={"query": QUESTION, "k": 3})
        assert response.status_code == 200
        return [hit["memory_id"] for hit in response.get_json()["results"]]

    assert searched() == [near, far]
    first = _ask(db_session, user)
    mark_not_relevant(db_session, user_id=user.id,
                      recall_id=str(first.reply.drew_on[0].recall_id))
    db_session.commit()
    assert searched() == [far, near]


@dataclass(frozen=True)
class _Hit:
    owner_id: int
    source_key: str
    source_id: str
    relevance: str = RELEVANT


@dataclass(frozen=True)
class _Unlabelled:
    owner_id: int
    source_key: str
    source_id: str


def test_demote_moves_marked_hits_last_in_order_unsure_and_cuts_to_k():
    hits = [_Hit(1, "s", "a"), _Hit(1, "s", "b"), _Hit(2, "s", "a"), _Hit(1, "s", "c")]
    demoted = frozenset({(1, "s", "a"), (1, "s", "b")})
    assert demote(hits, demoted) == [
        _Hit(2, "s", "a"), _Hit(1, "s", "c"),
        _Hit(1, "s", "a", POSSIBLY_RELATED), _Hit(1, "s", "b", POSSIBLY_RELATED)]
    assert demote(hits, demoted, 3)[-1] == _Hit(1, "s", "a", POSSIBLY_RELATED)
    assert demote(hits, frozenset(), 2) == hits[:2]
    # A hit with no label is moved, not labelled.
    assert demote([_Unlabelled(1, "s", "a"), _Unlabelled(1, "s", "z")], demoted) == [
        _Unlabelled(1, "s", "z"), _Unlabelled(1, "s", "a")]
    assert (widened(3, frozenset()), widened(3, demoted), widened(1, demoted)) == (3, 5, 2)
