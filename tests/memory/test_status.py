"""The Memory Status page: every source with the status sentence, the chunks stored, the
last build, a pending request (read from the rows, not from Redis), the flagged messages,
the dry run of the next build, "Update my memory now", and no content anywhere."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from markupsafe import escape
from sqlalchemy import func, select, update

from dashboard.blinks.services import create_blink
from dashboard.memory.embedders import HashingEmbedder
from dashboard.memory.models import MemoryBuild, MemoryChunk
from dashboard.memory.pipeline import run_memory_build
from dashboard.orbitpilot.models import ProfileFact
from dashboard.plans.sentences import in_sentence, state_sentence
from dashboard.plans.services import SourceState, resolve_build_sources, resolve_sources
from dashboard.queues import build_queue
from dashboard.sources import BLINKS, CHAT_HISTORY, DOCUMENTS, PROFILE, SAVED, source_keys
from tests.conftest import csrf_from
from tests.factories import builds_of, make_conversation, make_plan, make_user, plans_of, user_turns

EMAIL = "status@example.test"
SU101 = ("Not remembered on the Free plan: your plan includes 3 sources, and your profile, "
         "your Blinks and saved memories come first.")


# -- helpers ------------------------------------------------------------------------------

def status_page(client) -> str:
    response = client.get("/memory/status")
    assert response.status_code == 200
    return response.get_data(as_text=True)


def main_of(html: str) -> str:
    """The page's own content (the docked chat window, another surface, is outside it)."""
    return re.search(r"<main\b.*?</main>", html, re.S).group(0)


def section(html: str, name: str) -> str:
    return re.search(rf'<section id="{name}".*?</section>', html, re.S).group(0)


def row(html: str, name: str, key: str) -> str:
    match = re.search(rf'<tr data-source="{re.escape(key)}"(?:(?!</tr>).)*</tr>',
                      section(html, name), re.S)
    assert match, f"no row for {key} in {name}"
    return match.group(0)


def attr(fragment: str, name: str) -> str:
    return re.search(rf'{name}="([^"]*)"', fragment).group(1)


def signed_in(db_session, auth, *, plan=None):
    user = make_user(db_session, plan=plan, email=EMAIL)
    auth.login(EMAIL)
    return user


def build_now(db_session, user, *, mode="quick"):
    """A real build in the test's transaction, recorded like the runner records one."""
    result = run_memory_build(user, mode, session=db_session, embedder=HashingEmbedder())
    record = MemoryBuild(user_id=user.id, mode=mode, trigger="user", status="succeeded",
                         added=result.added, removed=result.removed, kept=result.kept,
                         embedded=result.embedded, started_at=datetime.now(UTC),
                         finished_at=datetime.now(UTC), resolution=result.resolution)
    # Whatever the build's content changes requested is now done.
    for queued in db_session.scalars(select(MemoryBuild).where(
            MemoryBuild.user_id == user.id, MemoryBuild.status == "queued")):
        queued.status = "succeeded"
    db_session.add(record)
    db_session.flush()
    return record


@pytest.fixture
def redis_down(app, monkeypatch):
    """Every way to Redis fails, as in an outage."""
    def refuse(*args, **kwargs):
        raise ConnectionError("redis is down")

    monkeypatch.setattr(build_queue(app), "_connect", refuse)


# -- sentences ----------------------------------------------------------------------------

def test_labels_read_as_words_inside_a_sentence_and_names_keep_their_capitals():
    assert in_sentence("Your profile") == "your profile"
    assert in_sentence("Your Blinks") == "your Blinks"
    assert in_sentence("Saved memories") == "saved memories"
    assert in_sentence("Blinks") == "Blinks"
    assert in_sentence("OrbitPilot notes") == "OrbitPilot notes"
    assert in_sentence("API keys") == "API keys"


def test_each_state_has_its_sentence(app):  # the app installs the source registry
    from dashboard.plans.services import UserPlan

    plan = UserPlan(1, "Team", "team", 1, False, {PROFILE: False})
    resolution = resolve_sources(plan)
    sentences = {s.key: state_sentence(s, resolution) for s in resolution.sources}
    assert sentences == {
        PROFILE: "Not remembered on the Team plan: an administrator switched your profile off.",
        BLINKS: "Remembered: your Team plan includes your Blinks.",
        # One source fills the cap: no verb has to agree with "your Blinks".
        SAVED: "Not remembered on the Team plan: your plan includes 1 source, and it goes "
               "to your Blinks.",
        CHAT_HISTORY: "Not remembered on the Team plan: your plan includes 1 source, and it "
                      "goes to your Blinks.",
        DOCUMENTS: "Not remembered on the Team plan: an administrator has not switched on "
                   "uploaded documents.",
    }


# -- the page -----------------------------------------------------------------------------

def test_a_guest_sees_the_invitation_instead(client):
    from markupsafe import escape

    from dashboard.plans.sentences import GUEST_INVITATION

    response = client.get("/memory/status")
    assert response.status_code == 200
    page = response.get_data(as_text=True)
    assert str(escape(GUEST_INVITATION)) in page
    assert 'href="/auth/signup"' in page
    assert "What the next build will change" not in page


@pytest.mark.parametrize("setup", [
    {},  # the untouched Free plan
    {"cap": 5, "assignments": {SAVED: False, DOCUMENTS: True}},
    {"cap": 0},
    {"cap": 2, "assignments": {BLINKS: False}},
])
def test_every_source_shows_its_state_and_the_one_sentence(client, db_session, auth, setup):
    plan = make_plan(db_session, **setup) if setup else None
    user = signed_in(db_session, auth, plan=plan)
    resolution = resolve_build_sources(user, plans_of(db_session))
    html = status_page(client)
    rows = re.findall(r'<tr data-source="([^"]+)" data-state', section(html, "sources"))
    assert rows == list(source_keys())  # every source, in rank order
    for source in resolution.sources:
        found = row(html, "sources", source.key)
        assert attr(found, "data-state") == source.state.value
        assert str(escape(state_sentence(source, resolution))) in found
    assert attr(html, "data-cap") == str(resolution.plan.included_sources)


def test_every_resolution_state_of_a_signed_in_user_is_shown(db_session):
    # Between them, the cases above cover each state a signed-in user can be in.
    states = set()
    for setup in ({}, {"cap": 5, "assignments": {SAVED: False}}):
        plan = make_plan(db_session, **setup) if setup else None
        user = make_user(db_session, plan=plan)
        states |= {s.state for s in resolve_build_sources(user, plans_of(db_session)).sources}
    assert states == set(SourceState) - {SourceState.GUEST}


def test_su101_untouched_free_plan_names_the_three_sources_in_lower_case(
        client, db_session, auth):
    signed_in(db_session, auth)
    chat = row(status_page(client), "sources", CHAT_HISTORY)
    assert attr(chat, "data-state") == "evicted_by_cap"
    assert SU101 in chat


def test_a_queued_row_is_a_pending_request_whatever_redis_says(client, db_session, auth,
                                                               queue, redis_down):
    user = signed_in(db_session, auth)
    build = MemoryBuild(user_id=user.id, mode="quick", trigger="content_change",
                        status="queued")
    db_session.add(build)
    db_session.flush()
    pending = section(status_page(client), "pending")
    assert f'data-build="{build.id}" data-status="queued"' in pending
    assert "Requested at <time" in pending and ", waiting for a worker" in pending
    assert "Running since" not in pending


def test_update_now_while_redis_is_down_still_shows_the_request(client, db_session, auth,
                                                                redis_down):
    user = signed_in(db_session, auth)
    token = csrf_from(client, "/memory/status")
    response = client.post("/memory/update", data={"csrf_token": token})
    assert response.status_code == 303
    (build,) = builds_of(db_session, user.id)
    assert build.status == "queued"
    pending = section(status_page(client), "pending")
    assert f'data-build="{build.id}" data-status="queued"' in pending
    assert "waiting for a worker" in pending


def test_a_running_build_shows_since_when(client, db_session, auth):
    user = signed_in(db_session, auth)
    started = datetime(2031, 5, 4, 3, 2, 1, tzinfo=UTC)
    build = MemoryBuild(user_id=user.id, mode="full", trigger="admin", status="running",
                        started_at=started, heartbeat_at=started)
    db_session.add(build)
    db_session.flush()
    pending = section(status_page(client), "pending")
    assert f'data-build="{build.id}" data-status="running"' in pending
    assert "Running since <time" in pending and "2031-05-04 03:02:01 UTC" in pending
    assert "waiting for a worker" not in pending


def test_no_pending_request_says_so(client, db_session, auth):
    signed_in(db_session, auth)
    pending = section(status_page(client), "pending")
    assert 'data-status="idle"' in pending and "waiting for a worker" not in pending


def test_chunks_per_source_and_the_last_build(client, db_session, auth):
    user = signed_in(db_session, auth, plan=make_plan(db_session, cap=4))
    db_session.add(ProfileFact(user_id=user.id, key="city", value="Lyon"))
    create_blink(db_session, user_id=user.id, title="one", content="first Blink")
    create_blink(db_session, user_id=user.id, title="two", content="second Blink")
    make_conversation(db_session, user, [("q0", "a0"), ("q1", "a1"), ("q2", "a2")])
    build = build_now(db_session, user)
    assert (build.added, build.removed, build.kept, build.embedded) == (6, 0, 0, 6)

    html = status_page(client)
    chunks = {key: attr(row(html, "sources", key), "data-chunks") for key in source_keys()}
    assert chunks == {PROFILE: "1", BLINKS: "2", SAVED: "0", CHAT_HISTORY: "3",
                      DOCUMENTS: "0"}
    last = section(html, "last-build")
    assert f'data-build="{build.id}" data-status="succeeded"' in last
    assert all(f'<span data-count="{name}">{n} {name}</span>' in last
               for name, n in (("added", 6), ("removed", 0), ("kept", 0), ("embedded", 6)))
    assert "quick update" in last and "you asked" in last and "Succeeded" in last
    assert 'id="next-build-nothing"' in html  # nothing changed since
    assert 'id="next-build-table"' not in html  # and no table of zeros to read


def test_a_failed_last_build_shows_its_kind_and_what_memory_still_holds(client, db_session,
                                                                        auth):
    user = signed_in(db_session, auth)
    good = build_now(db_session, user)
    failed = MemoryBuild(user_id=user.id, mode="quick", trigger="schedule", status="failed",
                         error="timed out: the build ran longer than its job timeout",
                         created_at=good.created_at + timedelta(seconds=5),
                         finished_at=datetime.now(UTC))
    db_session.add(failed)
    db_session.flush()
    last = section(status_page(client), "last-build")
    assert f'data-build="{failed.id}" data-status="failed"' in last
    assert "timed out: the build ran longer than its job timeout" in last
    assert f'id="last-success" data-build="{good.id}"' in last


def test_next_build_removes_a_flagged_pair_after_a_build_made_its_chunk(client, db_session,
                                                                        auth):
    user = signed_in(db_session, auth, plan=make_plan(db_session, cap=4))
    _, messages = make_conversation(db_session, user, [("q0", "a0"), ("q1", "a1")])
    build_now(db_session, user)
    user_turns(messages)[1].not_remembered = True
    db_session.flush()
    # The flag asked for a build by itself, in the same flush.
    assert [b.trigger for b in builds_of(db_session, user.id) if b.status == "queued"] == \
        ["content_change"]

    html = status_page(client)
    chat = row(html, "next-build", CHAT_HISTORY)
    assert (attr(chat, "data-add"), attr(chat, "data-remove"), attr(chat, "data-net")) == \
        ("0", "1", "-1")
    assert attr(row(html, "sources", CHAT_HISTORY), "data-chunks") == "2"  # until it runs
    total = re.search(r'<tr id="next-build-total"[^>]*>', html).group(0)
    assert (attr(total, "data-add"), attr(total, "data-remove")) == ("0", "1")


def test_next_build_adds_a_new_blink(client, db_session, auth):
    user = signed_in(db_session, auth)
    create_blink(db_session, user_id=user.id, title="old", content="built already")
    build_now(db_session, user)
    create_blink(db_session, user_id=user.id, title="new", content="not built yet")
    db_session.flush()
    html = status_page(client)
    blinks = row(html, "next-build", BLINKS)
    assert (attr(blinks, "data-add"), attr(blinks, "data-remove"), attr(blinks, "data-net")) \
        == ("1", "0", "1")
    assert attr(row(html, "sources", BLINKS), "data-chunks") == "1"
    assert 'id="next-build-nothing"' not in html


def test_not_remembered_messages_are_counted(client, db_session, auth):
    user = signed_in(db_session, auth)
    make_conversation(db_session, user, [("a", "b"), ("c", "d"), ("e", None)],
                      flagged={0, 2})
    make_conversation(db_session, make_user(db_session), [("x", "y")], flagged={0})
    found = section(status_page(client), "sources")
    assert 'id="not-remembered" data-count="2"' in found
    assert "2 of your messages are marked “Not remembered”" in found


def test_update_now_requests_a_build_then_refuses_honestly(client, db_session, auth, queue):
    user = signed_in(db_session, auth)
    token = csrf_from(client, "/memory/status")
    first = client.post("/memory/update", data={"csrf_token": token})
    assert first.status_code == 303
    assert first.headers["Location"].endswith("/memory/status")
    assert [(b.trigger, b.status) for b in builds_of(db_session, user.id)] == \
        [("user", "queued")]

    second = client.post("/memory/update", data={"csrf_token": token})
    assert second.status_code == 303
    assert second.headers["Location"].endswith("/memory/status")
    html = main_of(status_page(client))
    assert "You asked for an update a moment ago; you can ask again in" in html
    assert "updated a moment ago" not in html and "was updated" not in html
    assert len(builds_of(db_session, user.id)) == 1
    # The earlier request is still there, waiting, and the page says so.
    assert "waiting for a worker" in section(html, "pending")


def test_update_now_joins_a_request_already_waiting(client, db_session, auth, queue):
    user = signed_in(db_session, auth)
    create_blink(db_session, user_id=user.id, title="", content="asks for a build itself")
    db_session.flush()
    (waiting,) = builds_of(db_session, user.id)
    token = csrf_from(client, "/memory/status")
    response = client.post("/memory/update", data={"csrf_token": token})
    assert response.status_code == 303
    assert [b.id for b in builds_of(db_session, user.id)] == [waiting.id]
    assert "An update was already waiting for a worker; your request joined it." in \
        main_of(status_page(client))


def test_home_page_links_to_memory_status(client, db_session, auth):
    signed_in(db_session, auth)
    assert 'href="/memory/status"' in main_of(client.get("/").get_data(as_text=True))


def test_no_content_of_the_user_appears(client, db_session, auth):
    user = signed_in(db_session, auth, plan=make_plan(db_session, cap=5,
                                                      assignments={DOCUMENTS: True}))
    canary = "CANARY-7f3a"
    db_session.add(ProfileFact(user_id=user.id, key="city", value=f"{canary} profile"))
    create_blink(db_session, user_id=user.id, title=f"{canary} title",
                 content=f"{canary} Blink")
    make_conversation(db_session, user, [(f"{canary} question", f"{canary} answer"),
                                         (f"{canary} flagged", f"{canary} reply")],
                      flagged={1}, title=f"{canary} conversation")
    build_now(db_session, user)
    create_blink(db_session, user_id=user.id, title="", content=f"{canary} pending Blink")
    db_session.flush()
    html = main_of(status_page(client))
    assert "data-chunks=\"1\"" in html  # the page did show what was built
    assert canary.lower() not in html.lower()


# -- the query budget ---------------------------------------------------------------------

def _page_queries(client, auth, count_queries, email) -> list[str]:
    auth.login(email)
    status_page(client)  # warm: first-request work (templates, metadata) is not the page's
    with count_queries() as q:
        status_page(client)
    auth.logout()
    return q.statements


def test_query_count_does_not_grow_with_builds_chunks_or_sources(client, db_session, auth,
                                                                 count_queries):
    plan = make_plan(db_session, cap=4)
    small = make_user(db_session, plan=plan, email="small@example.test")
    build_now(db_session, small)  # one build, no chunks

    big = make_user(db_session, plan=plan, email="big@example.test")
    db_session.add(ProfileFact(user_id=big.id, key="city", value="Lyon"))
    for n in range(12):
        create_blink(db_session, user_id=big.id, title=f"t{n}", content=f"Blink {n}")
    make_conversation(db_session, big, [(f"q{n}", f"a{n}") for n in range(40)],
                      flagged={3, 9})
    for _ in range(28):  # the content's own request (settled by the first) makes 29
        build_now(db_session, big)
    db_session.add(MemoryBuild(user_id=big.id, mode="quick", trigger="user",
                               status="queued"))
    db_session.flush()
    assert db_session.scalar(select(func.count()).select_from(MemoryBuild)
                             .where(MemoryBuild.user_id == big.id)) == 30

    small = _page_queries(client, auth, count_queries, "small@example.test")
    big = _page_queries(client, auth, count_queries, "big@example.test")
    assert len(small) == len(big)
    # The page's own: the plan (1: the chat notice shares it), the builds (1), flagged
    # messages (1), and the dry run: the memory state (1, read with the check that it
    # comes from this server's transaction history), stored chunks per source and model
    # (1), the sources it re-reads whole (extractions + their stored keys), chat history.
    # Retention's notice: a legal hold and the purges due soon (1). The docked chat
    # window, another surface on every page, adds its own (1). The user comes from the
    # test session's identity map; in production Flask-Login adds one.
    assert len(big) == 12, "\n".join(big)


def test_chunks_of_a_source_no_longer_offered_are_shown_and_counted_as_removals(
        client, db_session, auth):
    user = signed_in(db_session, auth, plan=make_plan(db_session, cap=4))
    create_blink(db_session, user_id=user.id, title="", content="a Blink")
    build_now(db_session, user)
    db_session.execute(update(MemoryChunk).where(MemoryChunk.user_id == user.id)
                       .values(source_key="retired.source"))
    db_session.flush()
    html = status_page(client)
    assert attr(row(html, "sources", "other"), "data-chunks") == "1"
    assert attr(row(html, "next-build", "other"), "data-remove") == "1"
