"""The audit log in the staff console: read-only, role-gated, filterable, paged by
position, exportable as CSV that cannot run as a spreadsheet formula, and free of content.

Other tests of a full run may have committed events (the app role cannot delete them), so
every test here picks out its own events by values no other test uses."""

from __future__ import annotations

import csv
import html
import io
import re
import uuid
from datetime import UTC, datetime

import pytest

import dashboard.audit.services as services
from dashboard.audit.services import Actor, record_event
from dashboard.audit.views import PAGE_SIZE
from tests.conftest import csrf_from
from tests.factories import make_conversation, make_user

LIST = "/admin/audit/"
EXPORT = "/admin/audit/export/csv/"
BIG = str(2**63)
# Only the test's own events are this old: every other event is recorded "now".
OLD = "flt9_date_before=2003-01-01 00:00:00"
SEQ_CELL = re.compile(r'<td class="col-seq">\s*(\d+)\s*</td>')
PAGER_LINK = re.compile(r'<a class="page-link" rel="(first|prev|next)" href="([^"]+)"')


def token() -> str:
    return uuid.uuid4().hex[:10]


def seqs_on(response) -> list[int]:
    return [int(s) for s in SEQ_CELL.findall(response.get_data(as_text=True))]


def pager_links(response) -> dict[str, str]:
    return {rel: html.unescape(href)
            for rel, href in PAGER_LINK.findall(response.get_data(as_text=True))}


def csv_rows(response) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(response.get_data(as_text=True))))


def record_at(monkeypatch, session, when: datetime, **fields):
    """``record_event`` as if it ran at ``when`` (the chain stays valid)."""

    class Clock(datetime):
        @classmethod
        def now(cls, tz=None):
            return when

    monkeypatch.setattr(services, "datetime", Clock)
    try:
        return record_event(session, **fields)
    finally:
        monkeypatch.undo()


def events(session, action: str, count: int, **fields):
    return [record_event(session, action=action, actor=fields.pop("actor", Actor("system")),
                         **fields) for _ in range(count)]


@pytest.fixture
def staff(db_session):
    return {role: make_user(db_session, role=role, email=f"audit-{role}@example.test")
            for role in ("user", "support", "admin")}


def sign_in(auth, staff, role: str) -> None:
    assert auth.login(staff[role].email).status_code == 302


# -- who may read it ----------------------------------------------------------------------

@pytest.mark.parametrize("path", [LIST, EXPORT, "/admin/audit/details/?id={id}"])
def test_guests_are_sent_to_sign_in(client, db_session, path):
    event = record_event(db_session, action="test.gate", actor=Actor("system"))
    response = client.get(path.format(id=event.id))
    assert response.status_code == 302
    assert "/auth/signin" in response.headers["Location"]


@pytest.mark.parametrize("path", [LIST, EXPORT, "/admin/audit/details/?id={id}"])
def test_users_are_refused(client, db_session, auth, staff, path):
    event = record_event(db_session, action="test.gate", actor=Actor("system"))
    sign_in(auth, staff, "user")
    assert client.get(path.format(id=event.id)).status_code == 403


@pytest.mark.parametrize("role", ["support", "admin"])
@pytest.mark.parametrize("path", [LIST, EXPORT, "/admin/audit/details/?id={id}"])
def test_support_and_admin_may_read_it(client, db_session, auth, staff, role, path):
    event = record_event(db_session, action="test.gate", actor=Actor("system"))
    sign_in(auth, staff, role)
    assert client.get(path.format(id=event.id)).status_code == 200


@pytest.mark.parametrize("path", ["/admin/audit/new/", "/admin/audit/edit/?id={id}"])
def test_there_is_no_create_or_edit_page(client, db_session, auth, staff, path):
    event = record_event(db_session, action="test.readonly", actor=Actor("system"))
    sign_in(auth, staff, "admin")
    assert client.get(path.format(id=event.id)).status_code == 404


@pytest.mark.parametrize(("path", "status"), [
    ("/admin/audit/delete/", 404), ("/admin/audit/new/", 404),
    ("/admin/audit/edit/?id={id}", 404), ("/admin/audit/ajax/update/", 404),
    ("/admin/audit/action/", 400),  # there is no action, "delete" least of all
])
def test_nothing_can_be_posted_to_it(client, db_session, auth, staff, path, status):
    event = record_event(db_session, action="test.readonly", actor=Actor("system"))
    sign_in(auth, staff, "admin")
    csrf = csrf_from(client, "/")
    response = client.post(path.format(id=event.id), data={
        "csrf_token": csrf, "id": str(event.id), "action": "delete", "rowid": str(event.id),
        "list_form_pk": str(event.id), "action_name": "x"})
    assert response.status_code == status
    assert db_session.get(type(event), event.id).action == "test.readonly"


# -- what a page shows ----------------------------------------------------------------------

def test_a_row_shows_its_fields_compactly_and_the_details_page_in_full(
        client, db_session, auth, staff):
    event = record_event(
        db_session, action="plan.update", actor=Actor("admin", "7"), owner_id=42,
        target_type="plan", target_id=3, mode="edit",
        details={"before": {"included_sources": 3, "active": True},
                 "after": {"included_sources": 4, "active": True}, "reason": "<b>why</b>"})
    sign_in(auth, staff, "support")
    page = client.get(f"{LIST}?flt0_action_equals=plan.update").get_data(as_text=True)
    assert "included_sources: 3 → 4" in page
    assert "active: true → true" in page
    assert "reason: &#34;&lt;b&gt;why&lt;/b&gt;&#34;" in page  # escaped, never markup
    assert "admin:7" in page and "plan:3" in page
    assert f"{event.hash[:12]}…" in page
    assert event.hash not in page  # shortened in the list

    details = client.get(f"/admin/audit/details/?id={event.id}")
    assert details.status_code == 200
    text = details.get_data(as_text=True)
    assert event.hash in text and event.prev_hash in text


# -- filters ------------------------------------------------------------------------------

@pytest.fixture
def three_events(db_session, monkeypatch):
    """Three old events, spread over 2001, with values no other test uses."""
    t = token()
    owner_a, owner_b = 10**15 + int(t[:6], 16), 10**15 + int(t[:6], 16) + 1
    made = [
        record_at(monkeypatch, db_session, datetime(2001, 1, 1, tzinfo=UTC),
                  action=f"t{t}.plan.update", actor=Actor("admin", f"a{t}"),
                  owner_id=owner_a, target_type=f"plan{t}", target_id=f"p{t}",
                  details={"before": {"cap": 3}, "after": {"cap": 4}}),
        record_at(monkeypatch, db_session, datetime(2001, 6, 1, tzinfo=UTC),
                  action=f"t{t}.memory.forget", actor=Actor("user", f"u{t}"),
                  owner_id=owner_b, target_type=f"memory{t}", target_id=f"m1{t}",
                  mode=f"m{t}"),
        record_at(monkeypatch, db_session, datetime(2002, 1, 1, tzinfo=UTC),
                  action=f"t{t}.memory.forget", actor=Actor("api_key", f"k{t}"),
                  owner_id=owner_b, target_type=f"memory{t}", target_id=f"m2{t}",
                  mode=f"m{t}"),
    ]
    return t, owner_a, owner_b, [e.seq for e in made]


FILTER_CASES = [
    ("flt0_action_equals=t{t}.memory.forget", [2, 1]),
    ("flt0_action_equals=t{t}.plan.update", [0]),
    ("flt0_mode_equals=m{t}", [2, 1]),
    ("flt0_actor_type_equals=api_key", [2]),
    ("flt0_actor_id_equals=u{t}", [1]),
    ("flt0_owner_id_equals={owner_a}", [0]),
    ("flt0_owner_id_equals={owner_b}", [2, 1]),
    ("flt0_target_type_equals=memory{t}", [2, 1]),
    ("flt0_target_id_equals=p{t}", [0]),
    ("flt0_date_between=2001-03-01 00:00:00 to 2001-12-31 23:59:59", [1]),
    ("flt0_date_between=2001-01-01 to 2001-06-01", [1, 0]),  # both ends included
    ("flt0_date_after=2001-03-01 00:00:00", [2, 1]),
    ("flt0_date_before=2001-03-01", [0]),
    ("flt0_action_equals=t{t}.memory.forget&flt1_actor_type_equals=user", [1]),
    ("flt0_action_equals=nothing-{t}", []),
]


@pytest.mark.parametrize(("query", "expected"), FILTER_CASES)
def test_each_filter_narrows_the_list(client, db_session, auth, staff, three_events,
                                      query, expected):
    t, owner_a, owner_b, seqs = three_events
    sign_in(auth, staff, "support")
    response = client.get(f"{LIST}?{query.format(t=t, owner_a=owner_a, owner_b=owner_b)}"
                          f"&{OLD}")
    assert response.status_code == 200
    assert seqs_on(response) == [seqs[i] for i in expected]


BAD_QUERIES = [
    "flt0_owner_id_equals=abc", f"flt0_owner_id_equals={BIG}", "flt0_owner_id_equals=-1",
    "flt0_owner_id_equals=", "flt0_actor_type_equals=robot", "flt0_action_equals=",
    f"flt0_action_equals={'x' * 65}", "flt0_mode_equals=" + "m" * 17,
    "flt0_date_after=yesterday", "flt0_date_before=2001-02-30",
    "flt0_date_between=2001-01-01", "flt0_date_between=2001-01-02 to 2001-01-01",
    "flt0_nope_equals=1", "flt0_0=abc", "flt0_action_contains=x",
    "before_seq=abc", "before_seq=-1", f"before_seq={BIG}", "after_seq=",
    "before_seq=5&after_seq=2", "page=1", "sort=2", "sort=99", "desc=3",
]


@pytest.mark.parametrize("path", [LIST, EXPORT])
@pytest.mark.parametrize("query", BAD_QUERIES)
def test_a_bad_filter_or_position_is_a_400(client, db_session, auth, staff, path, query):
    sign_in(auth, staff, "support")
    assert client.get(f"{path}?{query}").status_code == 400


# -- paging ---------------------------------------------------------------------------------

def test_older_and_newer_links_walk_the_filtered_list_by_position(
        client, db_session, auth, staff):
    action = f"t{token()}.page"
    made = [e.seq for e in events(db_session, action, 120)]
    noise = events(db_session, f"t{token()}.other", 3)  # newer, filtered out
    newest_first = made[::-1]
    sign_in(auth, staff, "admin")

    first = client.get(f"{LIST}?flt0_action_equals={action}")
    assert seqs_on(first) == newest_first[:50]
    assert set(pager_links(first)) == {"next"}
    second = client.get(pager_links(first)["next"])
    assert f"before_seq={newest_first[49]}" in pager_links(first)["next"]
    assert seqs_on(second) == newest_first[50:100]
    third = client.get(pager_links(second)["next"])
    assert seqs_on(third) == newest_first[100:]
    assert set(pager_links(third)) == {"first", "prev"}  # no older page
    back = client.get(pager_links(third)["prev"])
    assert seqs_on(back) == newest_first[50:100]
    assert seqs_on(client.get(pager_links(back)["prev"])) == newest_first[:50]
    assert all(e.seq not in seqs_on(first) for e in noise)


def test_ascending_order_pages_forward_from_the_oldest(client, db_session, auth, staff):
    action = f"t{token()}.asc"
    made = [e.seq for e in events(db_session, action, 60)]
    sign_in(auth, staff, "admin")
    first = client.get(f"{LIST}?flt0_action_equals={action}&sort=0")
    assert seqs_on(first) == made[:50]
    second = client.get(pager_links(first)["next"])
    assert seqs_on(second) == made[50:]
    assert seqs_on(client.get(pager_links(second)["prev"])) == made[:50]


# -- export ---------------------------------------------------------------------------------

def test_the_csv_is_the_filtered_list_in_the_same_order(client, db_session, auth, staff):
    action = f"t{token()}.export"
    made = events(db_session, action, 70, owner_id=5)
    events(db_session, f"t{token()}.other", 2, owner_id=5)
    sign_in(auth, staff, "support")
    for query in (f"flt0_action_equals={action}",
                  f"flt0_action_equals={action}&sort=0",
                  f"flt0_action_equals={action}&sort=0&desc=1",
                  f"flt0_action_equals={action}&before_seq={made[30].seq}",
                  f"flt0_action_equals={action}&after_seq={made[10].seq}&sort=0"):
        listed = seqs_on(client.get(f"{LIST}?{query}"))
        exported = client.get(f"{EXPORT}?{query}")
        assert exported.status_code == 200
        rows = csv_rows(exported)
        # The list shows one page; the export runs on from the same first row.
        assert [int(r["seq"]) for r in rows][: len(listed)] == listed
        assert {r["action"] for r in rows} == {action}
    everything = csv_rows(client.get(f"{EXPORT}?flt0_action_equals={action}"))
    assert [int(r["seq"]) for r in everything] == [e.seq for e in reversed(made)]
    head = everything[0]
    assert head["hash"] == made[-1].hash and head["prev_hash"] == made[-2].hash
    assert head["occurred_at"] == made[-1].occurred_at.astimezone(UTC).isoformat(
        timespec="microseconds")


def test_csv_cells_cannot_run_as_formulas(client, db_session, auth, staff):
    action = f"t{token()}.formula"
    hostile = ["=HYPERLINK(\"http://evil.example\")", "+1+1", "-2+3", "@SUM(A1)",
               "\tcmd", "plain"]
    for value in hostile:
        record_event(db_session, action=action, actor=Actor("api_key", value),
                     target_type="memory", target_id=value,
                     details={"reason": "=1+1"})
    sign_in(auth, staff, "admin")
    rows = csv_rows(client.get(f"{EXPORT}?flt0_action_equals={action}&sort=0"))
    expected = ["'" + v if v != "plain" else v for v in hostile]
    assert [r["target_id"] for r in rows] == expected
    assert [r["actor_id"] for r in rows] == expected
    assert all(r["details"] == '{"reason":"=1+1"}' for r in rows)  # not at a cell's start


# -- cost -----------------------------------------------------------------------------------

def test_a_page_costs_the_same_queries_for_10_events_as_for_1000(
        client, db_session, auth, staff, count_queries):
    action = f"t{token()}.budget"
    sign_in(auth, staff, "support")
    # The unfiltered page shows the newest events of every test before this one too
    # (committed ones stay: the log is append-only); a full page of ours makes both
    # unfiltered pages show the same kind of rows.
    events(db_session, f"{action}.page", PAGE_SIZE)
    events(db_session, action, 10)
    client.get(LIST)  # warm: anything done once per process is not a page's cost
    with count_queries() as few:
        assert client.get(LIST).status_code == 200
    with count_queries() as few_filtered:
        assert client.get(f"{LIST}?flt0_action_equals={action}").status_code == 200
    events(db_session, action, 990)
    with count_queries() as many:
        assert client.get(LIST).status_code == 200
    with count_queries() as many_filtered:
        assert client.get(f"{LIST}?flt0_action_equals={action}").status_code == 200
    assert many.count == few.count
    assert many_filtered.count == few_filtered.count
    assert not any("count(" in s.lower() for s in many.statements + many_filtered.statements)


# -- never content --------------------------------------------------------------------------

def test_an_event_about_a_message_shows_its_ids_and_never_its_text(
        client, db_session, auth, staff):
    canary = f"CANARY-{token()}"
    owner = make_user(db_session)
    _, messages = make_conversation(db_session, owner, [(f"{canary} question",
                                                         f"{canary} answer")])
    message = messages[0]
    event = record_event(db_session, action="orbitpilot.message.remember",
                         actor=Actor.of(owner), owner_id=owner.id, target_type="message",
                         target_id=message.id,
                         details={"message_id": message.id, "not_remembered": True})
    sign_in(auth, staff, "support")
    listed = client.get(f"{LIST}?flt0_owner_id_equals={owner.id}").get_data(as_text=True)
    details = client.get(f"/admin/audit/details/?id={event.id}").get_data(as_text=True)
    exported = client.get(f"{EXPORT}?flt0_owner_id_equals={owner.id}").get_data(as_text=True)
    assert all(canary not in text for text in (listed, details, exported))
    # What it does show: the ids.
    assert f"message:{message.id}" in listed and f"message_id: {message.id}" in listed
    assert f"&#34;message_id&#34;: {message.id}" in details
    (row,) = csv.DictReader(io.StringIO(exported))
    assert (row["target_type"], row["target_id"]) == ("message", str(message.id))
    assert row["details"] == f'{{"message_id":{message.id},"not_remembered":true}}'


def test_a_person_who_acted_is_shown_by_email_linked_to_their_trace(client, db_session, auth,
                                                                    staff):
    actor = staff["admin"]
    record_event(db_session, action="plan.cap", actor=Actor.of(actor), target_type="plan",
                 target_id=1)
    record_event(db_session, action="plan.cap", actor=Actor("admin", "2147483000"),
                 target_type="plan", target_id=1)  # someone since deleted
    sign_in(auth, staff, "support")
    page = client.get(f"{LIST}?flt0_action_equals=plan.cap").get_data(as_text=True)
    # The email cut short by the stylesheet, the whole of it on hover and in the text.
    assert (f'<a href="/support/users/{actor.id}" title="admin:{actor.id}">'
            f'<span class="op-trunc" title="{actor.email}">{actor.email}</span></a>' in page)
    assert "admin:2147483000" in page  # by kind and id: there is no email to show


def test_times_read_to_the_second_with_their_zone_and_the_exact_value_on_hover(
        client, db_session, auth, staff, monkeypatch):
    when = datetime(2001, 2, 3, 4, 5, 6, 789012, tzinfo=UTC)
    event = record_at(monkeypatch, db_session, when, action="plan.update",
                      actor=Actor("system"), target_type=f"plan{token()}")
    sign_in(auth, staff, "support")
    exact = '<time datetime="2001-02-03T04:05:06.789012+00:00" ' \
            'title="2001-02-03T04:05:06.789012+00:00">2001-02-03 04:05:06 UTC</time>'
    listed = client.get(f"{LIST}?flt0_target_type_equals={event.target_type}&{OLD}")
    assert exact in listed.get_data(as_text=True)
    details = client.get(f"/admin/audit/details/?id={event.id}")
    assert exact in details.get_data(as_text=True)


def test_the_action_and_mode_filters_offer_every_action_and_mode_by_name(
        client, auth, staff):
    from dashboard.audit.actions import ACTIONS, MODES

    sign_in(auth, staff, "support")
    page = html.unescape(client.get(LIST).get_data(as_text=True))
    for code, words in {**ACTIONS, **MODES}.items():
        assert f"{words} ({code})" in page
