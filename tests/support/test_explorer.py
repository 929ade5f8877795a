"""The support explorer: read-only traces and the plan report, for support and admin.

Pages are checked through the client (roles, statuses, what is shown and never shown);
the SQL budget through ``count_queries``: the same count however many builds or plans."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, or_, select, text

from dashboard.auth.models import User
from dashboard.blinks.models import Blink
from dashboard.documents.models import Document
from dashboard.memory.models import EMBEDDING_DIMENSIONS, MemoryChunk
from dashboard.orbitpilot.models import ProfileFact
from dashboard.plans.services import UserPlan, resolve_sources
from dashboard.saved_memories.models import Memory
from dashboard.sources import BLINKS, CHAT_HISTORY, DOCUMENTS, PROFILE, SAVED
from dashboard.support.services import (
    MAX_MATCHES,
    find_users,
    match_query,
    plan_report,
    user_trace,
)
from dashboard.support.views import NO_MATCH, TOO_SHORT
from tests.factories import default_plan, make_build_record, make_conversation, make_plan, make_user

SUPPORT = "help@example.test"
ADMIN = "root@example.test"
PLAIN = "someone@example.test"
PAGES = ("/support/", "/support/users/{id}", "/support/plans")


@pytest.fixture
def staff(db_session):
    make_user(db_session, role="support", email=SUPPORT)
    make_user(db_session, role="admin", email=ADMIN)
    make_user(db_session, role="user", email=PLAIN)


@pytest.fixture
def target(db_session, staff):
    """A user on the untouched default plan (plan_id NULL)."""
    return make_user(db_session, email="target@example.test")


def html(response) -> str:
    return response.get_data(as_text=True)


def source_row(page: str, key: str) -> str:
    """The trace table's row of one source."""
    match = re.search(rf'<tr data-source="{re.escape(key)}"[^>]*>(.*?)</tr>', page, re.S)
    assert match, f"no row for {key}"
    return match.group(1)


def plan_row(page: str, plan_id: int) -> str:
    match = re.search(rf'<tr data-plan="{plan_id}">(.*?)</tr>', page, re.S)
    assert match, f"no row for plan {plan_id}"
    return match.group(1)


def evicted_cell(row: str) -> dict[str, str]:
    return dict(re.findall(r'<div data-evicted="([^"]+)">(.*?)</div>', row, re.S))


def chunk(user, key: str, source_id: str, index: int = 0, content: str = "x") -> MemoryChunk:
    return MemoryChunk(user_id=user.id, source_key=key, source_id=source_id, chunk_index=index,
                       content_hash=uuid.uuid4().hex, content=content,
                       embedding=[0.01] * EMBEDDING_DIMENSIONS, embedding_model="test")


def active_users_on_default(db_session) -> int:
    """Counted independently of the code under test: plan_id NULL is the default plan."""
    free = default_plan(db_session)
    return db_session.scalar(select(func.count()).select_from(User).where(
        User.active, or_(User.plan_id.is_(None), User.plan_id == free.id)))


# -- who may see it -----------------------------------------------------------------------

@pytest.mark.parametrize("page", PAGES)
def test_guest_is_sent_to_sign_in(client, target, page):
    response = client.get(page.format(id=target.id))
    assert response.status_code == 302
    assert response.headers["Location"].startswith("/auth/signin")


@pytest.mark.parametrize("page", PAGES)
def test_plain_user_is_refused(client, auth, target, page):
    auth.login(PLAIN)
    assert client.get(page.format(id=target.id)).status_code == 403


@pytest.mark.parametrize("email", (SUPPORT, ADMIN))
@pytest.mark.parametrize("page", PAGES)
def test_support_and_admin_see_every_page(client, auth, target, page, email):
    auth.login(email)
    assert client.get(page.format(id=target.id)).status_code == 200


# -- the lookup -----------------------------------------------------------------------------

def test_lookup_by_email_any_case_redirects_to_the_trace(client, auth, target):
    auth.login(SUPPORT)
    response = client.get("/support/", query_string={"q": "  Target@Example.TEST "})
    assert response.status_code == 302
    assert response.headers["Location"].endswith(f"/support/users/{target.id}")


def test_lookup_by_id_redirects_to_the_trace(client, auth, target):
    auth.login(SUPPORT)
    response = client.get("/support/", query_string={"q": str(target.id)})
    assert response.status_code == 302
    assert response.headers["Location"].endswith(f"/support/users/{target.id}")


@pytest.mark.parametrize("query", ("nobody@example.test", "99999999999999999999", "2147483648",
                                   "0", "not an email", "a@" + "b" * 300,
                                   "' OR 1=1 --@x", "%@%", "\u00e9@\u00e9.test"))
def test_lookup_miss_is_404_with_a_plain_message(client, auth, target, query):
    auth.login(SUPPORT)
    response = client.get("/support/", query_string={"q": query})
    assert response.status_code == 404
    assert NO_MATCH in html(response)


def test_lookup_with_a_nul_byte_is_refused_not_an_error(client, auth, staff):
    auth.login(SUPPORT)
    assert client.get("/support/", query_string={"q": "a\x00b@example.test"}).status_code == 400


def test_empty_lookup_shows_the_form_and_the_plan_report_link(client, auth, staff):
    auth.login(SUPPORT)
    response = client.get("/support/", query_string={"q": "   "})
    assert response.status_code == 200
    assert 'name="q"' in html(response) and 'href="/support/plans"' in html(response)


@pytest.mark.parametrize("tail", ("99999999999999999999", "2147483648", "9223372036854775808",
                                  "0", "-1", "abc", "1.5"))
def test_unknown_or_out_of_range_ids_are_404(client, auth, staff, tail):
    auth.login(SUPPORT)
    assert client.get(f"/support/users/{tail}").status_code == 404


def test_a_deleted_user_is_404(client, auth, db_session, staff):
    gone = make_user(db_session)
    gone_id = gone.id
    db_session.delete(gone)
    db_session.flush()
    auth.login(ADMIN)
    assert client.get(f"/support/users/{gone_id}").status_code == 404


# -- SU-101 Q1: chat history evicted by the default plan's cap ----------------------------

def test_su101_default_plan_evicts_chat_history(client, auth, db_session, target):
    auth.login(SUPPORT)
    page = html(client.get(f"/support/users/{target.id}"))
    assert "nobody chose a plan for this user, so they get the default" in page
    assert "(<code>plan_id</code> is empty)" in page  # the technical key, small beside
    for key in (PROFILE, BLINKS, SAVED):
        row = source_row(page, key)
        assert "included" in row and "default" in row
    row = source_row(page, CHAT_HISTORY)
    assert ">Left out by the cap</span>" in row and ">evicted_by_cap<" in row
    assert "the cap of 3 is filled by" in row
    assert all(label in row for label in ("Your profile", "Your Blinks", "Saved memories"))
    # the status sentence, word for word.
    assert ("Not remembered on the Free plan: your plan includes 3 sources, and your profile, "
            "your Blinks and saved memories come first.") in row
    assert ">not_assigned_by_default<" in source_row(page, DOCUMENTS)

    # The plan report: chat history evicted on the default plan, touching its users.
    report = html(client.get("/support/plans"))
    free = default_plan(db_session)
    evicted = evicted_cell(plan_row(report, free.id))
    assert list(evicted) == [CHAT_HISTORY]
    users = active_users_on_default(db_session)
    assert f"{users} users touched" in evicted[CHAT_HISTORY]
    # The default plan comes first.
    assert re.findall(r'data-plan="(\d+)"', report)[0] == str(free.id)


def test_su101_a_plan_with_cap_4_includes_chat_history(client, auth, db_session, target):
    roomy = make_plan(db_session, name="Roomy", cap=4)
    target.plan_id = roomy.id
    db_session.flush()
    auth.login(SUPPORT)
    page = html(client.get(f"/support/users/{target.id}"))
    assert "chosen for this user" in page
    row = source_row(page, CHAT_HISTORY)
    assert ">included<" in row and "Remembered: your Roomy plan includes chat history." in row

    report = plan_row(html(client.get("/support/plans")), roomy.id)
    assert evicted_cell(report) == {}
    assert "Chat history" in report.split("</td>")[3]  # the "Included" cell
    assert re.search(r'<td class="text-right">1</td>', report)  # its one user


def test_su101_raising_the_default_cap_to_4_includes_chat_history(client, auth, db_session,
                                                                  target):
    free = default_plan(db_session)
    free.included_sources = 4
    db_session.flush()
    auth.login(SUPPORT)
    assert ">included<" in source_row(html(client.get(f"/support/users/{target.id}")),
                                      CHAT_HISTORY)
    assert evicted_cell(plan_row(html(client.get("/support/plans")), free.id)) == {}


def test_plan_report_counts_every_plan_in_one_pass(db_session, staff):
    before = {row.id: row.users for row in plan_report(db_session)}
    free = default_plan(db_session)
    small = make_plan(db_session, name="Aaa small", cap=1,
                      assignments={BLINKS: False, DOCUMENTS: True})
    for _ in range(2):
        make_user(db_session)  # plan_id NULL: the default plan
    make_user(db_session, plan=free)  # the default plan by its own row
    for _ in range(3):
        make_user(db_session, plan=small)
    inactive = make_user(db_session, plan=small)
    inactive.active = False
    db_session.flush()

    rows = plan_report(db_session)
    assert rows[0].id == free.id  # the default plan first, then by name
    by_id = {row.id: row for row in rows}
    assert by_id[free.id].users == before[free.id] + 3
    assert by_id[small.id].users == 3
    # Cap 1 on a plan with Blinks off and documents on: profile included; saved memories,
    # chat history and documents evicted, each touching the plan's 3 active users.
    assert [s.key for s in by_id[small.id].included] == [PROFILE]
    assert [(e.source.key, e.users_touched) for e in by_id[small.id].evicted] == [
        (SAVED, 3), (CHAT_HISTORY, 3), (DOCUMENTS, 3)]
    assert [f.key for f in by_id[small.id].evicted[0].filled_by] == [PROFILE]


# -- now against the last build ------------------------------------------------------------

def test_state_at_last_build_from_its_snapshot(client, auth, db_session, target):
    free = UserPlan.from_plan(default_plan(db_session))
    # The last build ran when the plan's cap was 4: chat history was included then.
    then = resolve_sources(UserPlan(free.id, free.name, free.slug, 4, True)).to_dict()
    old = make_build_record(target, resolution=resolve_sources(free).to_dict(),
                finished_at=datetime.now(UTC) - timedelta(days=2))
    last = make_build_record(target, resolution=then)
    db_session.add_all([old, last])
    db_session.flush()

    trace = user_trace(db_session, target.id)
    assert trace.last_build.build.id == last.id and trace.last_build.cap == 4
    chat = next(s for s in trace.sources if s.key == CHAT_HISTORY)
    assert (chat.state, chat.state_then, chat.changed) == ("evicted_by_cap", "included", True)
    assert not any(s.changed for s in trace.sources if s.key != CHAT_HISTORY)

    auth.login(SUPPORT)
    page = html(client.get(f"/support/users/{target.id}"))
    row = source_row(page, CHAT_HISTORY)
    assert ">evicted_by_cap<" in row and ">included<" in row
    assert "changed since the last build" in row
    assert "changed since the last build" not in source_row(page, PROFILE)
    assert f'href="/admin/builds/details/?id={last.id}"' in page


def test_no_build_yet(client, auth, target):
    auth.login(SUPPORT)
    page = html(client.get(f"/support/users/{target.id}"))
    assert "no build yet" in source_row(page, PROFILE)
    assert "changed since the last build" not in page


def test_a_damaged_snapshot_is_shown_as_not_recorded(client, auth, db_session, target):
    db_session.add(make_build_record(
        target, resolution={"sources": [{"key": PROFILE, "state": "included"}, "junk",
                                        {"key": 3}]}))
    db_session.flush()
    auth.login(SUPPORT)
    response = client.get(f"/support/users/{target.id}")
    assert response.status_code == 200
    assert ">not_recorded<" in source_row(html(response), BLINKS)


# -- chunks, pending, history ---------------------------------------------------------------

def test_chunk_counts_per_source(client, auth, db_session, target):
    other = make_user(db_session)
    db_session.add_all([
        chunk(target, PROFILE, "profile", 0), chunk(target, PROFILE, "profile", 1),
        *(chunk(target, BLINKS, str(i)) for i in range(3)),
        chunk(target, "legacy.removed", "1"),
        chunk(other, SAVED, "x"),  # someone else's: not counted
    ])
    db_session.flush()
    trace = user_trace(db_session, target.id)
    assert {s.key: s.chunks for s in trace.sources} == {
        PROFILE: 2, BLINKS: 3, SAVED: 0, CHAT_HISTORY: 0, DOCUMENTS: 0}
    assert trace.other_chunks == (("legacy.removed", 1),) and trace.total_chunks == 6

    auth.login(SUPPORT)
    page = html(client.get(f"/support/users/{target.id}"))
    assert source_row(page, BLINKS).rstrip().endswith('<td class="text-right">3</td>')
    assert source_row(page, PROFILE).rstrip().endswith('<td class="text-right">2</td>')
    assert "a source this release no longer has" in source_row(page, "legacy.removed")


def test_pending_and_running_builds_are_shown(client, auth, db_session, target):
    running = make_build_record(target, "running", mode="quick", trigger="conversation_end")
    pending = make_build_record(target, "queued", mode="full", trigger="admin")
    db_session.add_all([running, pending])
    db_session.flush()
    auth.login(SUPPORT)
    page = html(client.get(f"/support/users/{target.id}"))
    pending_list = page[page.index('id="support-pending"'):]
    pending_list = pending_list[:pending_list.index("</ul>")]
    assert re.search(rf"Waiting to run: <a [^>]*>#{pending.id}</a>, asked <time[^>]*>[^<]+"
                     r"</time>, a full rebuild <small[^>]*>\(mode <code>full</code>, trigger "
                     r"<code>admin</code>\)", pending_list)
    assert re.search(rf"Running: <a [^>]*>#{running.id}</a>, a quick update, started .*"
                     r"\(mode <code>quick</code>", pending_list)


def test_build_history_is_the_latest_20(client, auth, db_session, target):
    base = datetime.now(UTC) - timedelta(days=1)
    builds = [make_build_record(target, "failed" if i % 5 == 0 else "succeeded", created_at=base +
                    timedelta(minutes=i), added=i, error="TimeoutError" if i % 5 == 0 else None)
              for i in range(25)]
    db_session.add_all(builds)
    db_session.flush()
    trace = user_trace(db_session, target.id)
    assert [b.id for b in trace.history] == [b.id for b in reversed(builds)][:20]
    assert trace.history[0].duration_seconds == pytest.approx(2, abs=0.5)

    auth.login(SUPPORT)
    page = html(client.get(f"/support/users/{target.id}"))
    table = page[page.index('id="support-builds"'):]
    shown = re.findall(r'href="/admin/builds/details/\?id=(\d+)"', table)
    assert shown == [str(b.id) for b in reversed(builds)][:20]
    assert "TimeoutError" in table


# -- the query budget -------------------------------------------------------------------------

def test_trace_costs_the_same_for_1_build_or_30_and_3_plans_or_30(client, auth, db_session,
                                                                   count_queries, staff):
    few, many = make_user(db_session), make_user(db_session)
    make_plan(db_session), make_plan(db_session)  # with the default plan: 3 plans
    db_session.add(make_build_record(few))
    db_session.add_all([make_build_record(many, "failed" if i % 3 else "succeeded",
                                          resolution=resolve_sources(None).to_dict())
                        for i in range(29)]
                       + [make_build_record(many, "queued"), make_build_record(many, "running")])
    db_session.add_all([chunk(many, key, str(i)) for i, key in enumerate((PROFILE, BLINKS))])
    db_session.flush()
    auth.login(SUPPORT)
    few_id, many_id = few.id, many.id

    def measure(user_id: int):
        # Every request starts alike, as in production: nothing of this test's session
        # trusted (the signed-in user, kept across requests here, is read again).
        db_session.expire_all()
        with count_queries() as counted:
            assert client.get(f"/support/users/{user_id}").status_code == 200
        return counted

    one_build, thirty_builds = measure(few_id), measure(many_id)
    for i in range(27):
        make_plan(db_session, assignments={CHAT_HISTORY: bool(i % 2)})
    thirty_plans = measure(many_id)

    assert one_build.count == thirty_builds.count == thirty_plans.count
    print(f"trace: {one_build.count} queries")


def test_plan_report_costs_the_same_for_3_plans_or_30(client, auth, db_session, count_queries,
                                                       staff):
    for _ in range(2):
        plan = make_plan(db_session, assignments={DOCUMENTS: True})
        make_user(db_session, plan=plan)
    auth.login(SUPPORT)

    def measure(plans_at_least: int):
        # Every request starts alike, as in production: nothing of this test's session
        # trusted (the signed-in user, kept across requests here, is read again).
        db_session.expire_all()
        with count_queries() as counted:
            response = client.get("/support/plans")
        assert response.status_code == 200
        assert html(response).count("data-plan=") >= plans_at_least
        return counted

    three = measure(3)
    for i in range(27):
        plan = make_plan(db_session, cap=i % 5,
                         assignments={DOCUMENTS: True, BLINKS: bool(i % 2)})
        make_user(db_session, plan=plan)
    thirty = measure(30)

    assert three.count == thirty.count
    print(f"plan report: {three.count} queries")


# -- never content ---------------------------------------------------------------------------

@pytest.mark.parametrize("email", (SUPPORT, ADMIN))
def test_no_page_shows_content(client, auth, db_session, staff, email):
    canary = f"canary-{uuid.uuid4().hex}"
    user = make_user(db_session, email="owner@example.test")
    user.display_name = f"{canary} display name"
    make_conversation(db_session, user, [(f"{canary} question", f"{canary} answer"),
                                         (f"{canary} second", None)], title=f"{canary} title")
    db_session.add_all([
        Blink(user_id=user.id, title=f"{canary} blink title", content=f"{canary} blink"),
        ProfileFact(user_id=user.id, key="city", value=f"{canary} city"),
        Memory(owner_id=user.id, content=f"{canary} memory", metadata_={"note": canary}),
        Document(user_id=user.id, title=f"{canary} doc title", filename=f"{canary}.txt",
                 content=f"{canary} document"),
        chunk(user, PROFILE, "profile", content=f"{canary} chunk"),
        make_build_record(user, "failed", error="ValueError"),
        make_build_record(user, resolution=resolve_sources(None).to_dict()),
    ])
    db_session.flush()
    auth.login(email)

    pages = [client.get("/support/", query_string={"q": user.email}, follow_redirects=True),
             client.get("/support/"), client.get(f"/support/users/{user.id}"),
             client.get("/support/plans")]
    for response in pages:
        assert response.status_code == 200
        assert canary not in html(response)
    # The trace did show this user: ids, email, counts.
    assert "owner@example.test" in html(pages[2]) and "Total chunks" in html(pages[2])



# -- finding a user by part of an email ----------------------------------------------------

def test_part_of_an_email_finds_its_one_user(client, auth, staff, db_session):
    found = make_user(db_session, email="free@demo.orbitpilot.test")
    auth.login(SUPPORT)
    response = client.get("/support/", query_string={"q": "free"})
    assert response.status_code == 302
    assert response.headers["Location"].endswith(f"/support/users/{found.id}")


def test_a_part_several_emails_hold_lists_them(client, auth, staff, db_session):
    mine = [make_user(db_session, email=f"part-{n}@listed.test") for n in range(3)]
    make_user(db_session, email="other@elsewhere.test")
    auth.login(SUPPORT)
    response = client.get("/support/", query_string={"q": "@LISTED"})
    assert response.status_code == 200
    links = re.findall(r'href="/support/users/(\d+)">([^<]+)</a>', html(response))
    assert links == [(str(u.id), u.email) for u in mine]


def test_too_short_a_part_says_so(client, auth, staff):
    auth.login(SUPPORT)
    response = client.get("/support/", query_string={"q": "fr"})
    assert response.status_code == 404 and TOO_SHORT in html(response)


def test_wildcards_in_a_part_are_plain_characters(db_session):
    make_user(db_session, email="axb@wild.test")
    assert find_users(db_session, "a_b@wild")[0] == []
    assert find_users(db_session, "a%b")[0] == []
    assert find_users(db_session, "%xb")[0] == []
    assert [m.email for m in find_users(db_session, "axb@wild")[0]] == ["axb@wild.test"]


def test_more_matches_than_listed_are_said_to_be_more(db_session):
    for n in range(MAX_MATCHES + 2):
        make_user(db_session, email=f"many{n:03}@crowd.test")
    matches, more = find_users(db_session, "many")
    assert len(matches) == MAX_MATCHES and more is True


def _insert_users(session, count: int, domain: str) -> None:
    session.execute(User.__table__.insert(), [
        {"email": f"bulk{n}@{domain}", "display_name": "", "password_hash": "x", "role": "user"}
        for n in range(count)])


@pytest.mark.parametrize("count", [10, 10_000])
def test_the_search_costs_one_query_whatever_the_number_of_users(db_session, count_queries,
                                                                 count):
    _insert_users(db_session, count, f"n{count}.test")
    make_user(db_session, email="needle-7f3a@haystack.test")
    with count_queries() as queries:
        matches, _ = find_users(db_session, "needle-7f3a")
    assert [m.email for m in matches] == ["needle-7f3a@haystack.test"]
    assert queries.count == 1


def test_the_search_reads_the_two_prefix_indexes(db_session):
    _insert_users(db_session, 10_000, "plan.test")
    db_session.execute(text("ANALYZE users"))
    compiled = match_query("needle-7f3a", limit=MAX_MATCHES + 1).compile(
        dialect=db_session.get_bind().dialect)
    plan = "\n".join(row[0] for row in db_session.connection().exec_driver_sql(
        f"EXPLAIN {compiled}", compiled.params))
    assert "ix_users_email_prefix" in plan and "ix_users_email_domain" in plan, plan
    assert "Seq Scan" not in plan and "uq_users_email" not in plan, plan


def test_a_whole_email_names_its_user_alone_among_longer_ones(db_session, count_queries):
    exact = make_user(db_session, email="ann@x.test")
    make_user(db_session, email="ann@x.test.example")
    with count_queries() as queries:
        matches, more = find_users(db_session, "ANN@x.test")
    assert [(m.id, m.email) for m in matches] == [(exact.id, "ann@x.test")] and not more
    assert queries.count == 1


def test_the_trace_counts_the_messages_marked_not_remembered_and_says_what_they_do(
        client, auth, db_session, target):
    canary = f"canary-{uuid.uuid4().hex}"
    make_conversation(db_session, target, [(f"{canary} one", "a"), (f"{canary} two", "b"),
                                           ("three", "c")], flagged={0, 1})
    auth.login(SUPPORT)
    page = html(client.get(f"/support/users/{target.id}"))
    cell = page[page.index('id="support-not-remembered"'):]
    cell = cell[:cell.index("</dd>")]
    assert "2 messages: they and the replies that answered them are left out of every " \
           "build" in cell
    # On Free the cap leaves chat history out anyway: the flags change nothing today.
    assert "Chat history is not remembered on this plan anyway" in cell
    assert canary not in page

    target.plan_id = make_plan(db_session, name="Roomy", cap=4).id
    db_session.flush()
    cell = html(client.get(f"/support/users/{target.id}"))
    cell = cell[cell.index('id="support-not-remembered"'):]
    cell = cell[:cell.index("</dd>")]
    assert "2 messages:" in cell and "anyway" not in cell
