"""The assignment page: the plans × sources matrix, the cap, the impact preview, and
what confirming does (the resolution, one audit event, the users' builds)."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import func, insert, select
from sqlalchemy.orm import selectinload

from dashboard.audit.models import AuditEvent
from dashboard.audit.services import SYSTEM
from dashboard.auth.models import User
from dashboard.memory import MemoryBuild, fan_out_plan_builds
from dashboard.plans.editing import PlanError, assignment_value, set_assignment, set_cap
from dashboard.plans.impact import plan_fingerprint, preview_plan_change
from dashboard.plans.models import Plan, SourceAssignment
from dashboard.plans.services import (
    SourceState,
    UserPlan,
    resolve_build_sources,
    resolve_sources,
)
from dashboard.sources import CHAT_HISTORY, SAVED, source_keys
from tests.conftest import csrf_from
from tests.factories import default_plan, make_plan, make_user, plans_of

MATRIX = "/admin/assignments/"


@pytest.fixture
def admin(db_session, auth):
    user = make_user(db_session, role="admin", email="root@example.test")
    auth.login("root@example.test")
    return user


@pytest.fixture(autouse=True)
def _audit_head(app):
    """Events of this test only: committed ones of other tests (a browser test's, a
    worker's) stay in the log, which nobody can delete from. Read on a connection of
    its own, so the fixture does not decide which session the test uses."""
    from dashboard.extensions import db

    global AUDIT_HEAD
    with app.app_context(), db.engine.connect() as conn:
        AUDIT_HEAD = conn.scalar(select(func.coalesce(func.max(AuditEvent.seq), 0)))


AUDIT_HEAD = 0


def audit_events(db_session, action=None):
    query = select(AuditEvent).where(AuditEvent.seq > AUDIT_HEAD).order_by(AuditEvent.seq)
    if action:
        query = query.where(AuditEvent.action == action)
    return db_session.scalars(query).all()


def post_change(client, path, **fields):
    token = csrf_from(client, MATRIX)
    return client.post(path, data={"csrf_token": token, **fields})


def test_toggling_chat_history_for_free_previews_then_applies_audits_and_requests_builds(
        client, db_session, admin, queue):
    free = default_plan(db_session)
    # Saved memories off on Free: chat history takes its place under the cap of 3.
    db_session.add(SourceAssignment(plan_id=free.id, source_key=SAVED, enabled=False))
    plus = make_plan(db_session, cap=5)
    on_free = [make_user(db_session) for _ in range(3)]
    on_plus = make_user(db_session, plan=plus)
    db_session.commit()
    queue.empty()
    chat = resolve_build_sources(on_free[0], plans_of(db_session)).get(CHAT_HISTORY)
    assert chat.state is SourceState.INCLUDED
    free_users = db_session.scalar(select(func.count()).select_from(User).where(
        (User.plan_id.is_(None)) | (User.plan_id == free.id), User.active))

    matrix = client.get(MATRIX).get_data(as_text=True)
    assert f'id="plan-{free.id}"' in matrix and "Switch off" in matrix

    preview = post_change(client, "/admin/assignments/preview", plan_id=free.id,
                          kind="assignment", source_key=CHAT_HISTORY, value="off")
    assert preview.status_code == 200
    html = preview.get_data(as_text=True)
    assert f"<strong>{free_users}</strong> user(s) lose <strong>Chat history</strong>" in html
    # Previewing changed nothing.
    assert audit_events(db_session, "assignment.set") == []
    assert queue.job_ids == []

    expected = re.search(r'name="expected" value="([^"]*)"', html).group(1)
    assert expected == plan_fingerprint(free)
    applied = post_change(client, "/admin/assignments/apply", plan_id=free.id,
                          kind="assignment", source_key=CHAT_HISTORY, value="off",
                          expected=expected)
    assert applied.status_code == 303
    db_session.expire_all()

    for user in on_free:
        state = resolve_build_sources(user, plans_of(db_session)).get(CHAT_HISTORY).state
        assert state is SourceState.NOT_ASSIGNED_BY_ADMIN
    chat = resolve_build_sources(on_plus, plans_of(db_session)).get(CHAT_HISTORY)
    assert chat.state is SourceState.INCLUDED

    (event,) = audit_events(db_session, "assignment.set")
    assert (event.actor_type, event.actor_id) == ("admin", str(admin.id))
    assert (event.target_type, event.target_id) == ("plan", str(free.id))
    assert event.details["source_key"] == CHAT_HISTORY
    assert (event.details["before"], event.details["after"]) == ({"row": "default"},
                                                                 {"row": "off"})
    assert event.details["impact"] == {"users": free_users, "gain": [],
                                       "lose": [CHAT_HISTORY]}
    assert len(audit_events(db_session)) == 1

    # The builds are requested in the background: one fan-out job for Free, which
    # requests a build for every active Free user and nobody else.
    (job,) = [queue.fetch_job(job_id) for job_id in queue.job_ids]
    assert (job.func_name, job.args) == ("jobs.builds.fan_out_plan", (free.id,))
    assert fan_out_plan_builds(db_session, free.id, batch_size=500) == free_users
    for user in on_free:
        (build,) = db_session.scalars(select(MemoryBuild).where(
            MemoryBuild.user_id == user.id)).all()
        assert (build.trigger, build.status) == ("plan_change", "queued")
    assert db_session.scalars(select(MemoryBuild).where(
        MemoryBuild.user_id == on_plus.id)).all() == []

    page = client.get(MATRIX).get_data(as_text=True)
    cell = re.search(rf'<tr id="plan-{free.id}">.*?</tr>', page, re.S).group(0)
    assert f'data-source="{CHAT_HISTORY}" data-row="off" data-state="not_assigned_by_admin"' \
        in cell


def recount(session, users) -> dict[int, set[str]]:
    """Each user's included sources, resolved one by one from every plan as stored now
    (read once, with its rows), not from the preview's counts per plan."""
    plans = {plan.id: UserPlan.from_plan(plan) for plan in session.scalars(
        select(Plan).options(selectinload(Plan.assignments))
        .execution_options(populate_existing=True))}
    default = next(plan for plan in plans.values() if plan.is_default)
    return {u.id: set(resolve_sources(plans.get(u.plan_id, default)).included_keys)
            for u in users}


def test_the_preview_equals_a_recount_over_1000_users(db_session):
    free = default_plan(db_session)
    plus = make_plan(db_session, cap=4, assignments={SAVED: False})
    team = make_plan(db_session, cap=2)
    # 1,000 users: most on Free (no plan row), some on Plus and Team, some inactive.
    rows = []
    for n in range(1000):
        plan_id = None if n % 10 < 6 else plus.id if n % 10 < 9 else team.id
        rows.append({"email": f"crowd{n}@example.test", "display_name": "", "role": "user",
                     "password_hash": "x", "plan_id": plan_id, "active": n % 17 != 0})
    db_session.execute(insert(User), rows)
    db_session.flush()
    users = db_session.scalars(select(User).where(User.active)).all()

    changes = [
        (free, {"assignment": (CHAT_HISTORY, "off")}),
        (free, {"assignment": (SAVED, "off")}),
        (free, {"cap": 4}),
        (free, {"cap": 1}),
        (plus, {"assignment": (SAVED, "default")}),
        (plus, {"assignment": (CHAT_HISTORY, "off")}),
        (team, {"cap": 5}),
    ]
    moved = []
    for plan, change in changes:
        impact = preview_plan_change(db_session, plan, cap=change.get("cap"),
                                     assignment=change.get("assignment"))
        before = recount(db_session, users)
        # The recount: apply the change for real, resolve every user again one by one,
        # and undo it.
        with db_session.begin_nested() as savepoint:
            if "cap" in change:
                set_cap(db_session, plan, change["cap"], actor=SYSTEM)
            else:
                set_assignment(db_session, plan, *change["assignment"], actor=SYSTEM)
            db_session.expire_all()
            after = recount(db_session, users)
            savepoint.rollback()
        db_session.expire_all()
        for key in source_keys():
            gain = sum(key in after[u] and key not in before[u] for u in before)
            lose = sum(key in before[u] and key not in after[u] for u in before)
            previewed_gain = impact.users if key in [s.key for s in impact.gained] else 0
            previewed_lose = impact.users if key in [s.key for s in impact.lost] else 0
            assert (previewed_gain, previewed_lose) == (gain, lose), (plan.name, change, key)
        moved.append(impact.changes_memory)
    # Chat history is evicted on Free already: switching it off moves no source.
    assert moved == [False, True, True, True, True, True, True]


def test_cap_validation(client, db_session, admin):
    plan = make_plan(db_session, cap=3)
    for raw in ("6", "-1", "abc", "", "3.5", "1e3"):
        response = post_change(client, "/admin/assignments/preview", plan_id=plan.id,
                               kind="cap", cap=raw)
        assert response.status_code == 400, raw
        assert "Choose a whole number from 0 to 5" in response.get_data(as_text=True)
    for bad in (6, -1, True, "3", None):
        with pytest.raises(PlanError) as refused:
            set_cap(db_session, plan, bad, actor=SYSTEM)
        assert refused.value.field == "included_sources"
    assert db_session.get(Plan, plan.id).included_sources == 3
    assert audit_events(db_session) == []


def test_a_cap_change_through_the_preview(client, db_session, admin, queue):
    plan = make_plan(db_session, cap=3)
    members = [make_user(db_session, plan=plan) for _ in range(2)]
    db_session.commit()
    queue.empty()
    html = post_change(client, "/admin/assignments/preview", plan_id=plan.id, kind="cap",
                       cap="4").get_data(as_text=True)
    assert "<strong>2</strong> user(s) gain <strong>Chat history</strong>" in html
    response = post_change(client, "/admin/assignments/apply", plan_id=plan.id, kind="cap",
                           cap="4", expected=plan_fingerprint(plan))
    assert response.status_code == 303
    db_session.expire_all()
    assert db_session.get(Plan, plan.id).included_sources == 4
    (event,) = audit_events(db_session, "plan.cap")
    assert (event.details["before"], event.details["after"]) == (
        {"included_sources": 3}, {"included_sources": 4})
    assert event.details["impact"] == {"users": 2, "gain": [CHAT_HISTORY], "lose": []}
    assert [queue.fetch_job(j).args for j in queue.job_ids] == [(plan.id,)]
    for user in members:
        assert resolve_build_sources(user, plans_of(db_session)).get(CHAT_HISTORY).remembered


@pytest.mark.parametrize("meanwhile", ["same row", "the cap", "another row"])
def test_a_confirm_of_a_stale_preview_applies_nothing(client, db_session, admin, meanwhile):
    plan = make_plan(db_session, cap=3)
    db_session.commit()
    # This admin previews switching saved memories off (chat history would come in)...
    html = post_change(client, "/admin/assignments/preview", plan_id=plan.id,
                       kind="assignment", source_key=SAVED, value="off").get_data(as_text=True)
    assert "gain <strong>Chat history</strong>" in html
    seen = re.search(r'name="expected" value="([^"]*)"', html).group(1)
    # ...and before they confirm, another change makes that impact untrue.
    if meanwhile == "same row":
        set_assignment(db_session, plan, SAVED, "on", actor=SYSTEM)
    elif meanwhile == "the cap":
        set_cap(db_session, plan, 5, actor=SYSTEM)
    else:
        set_assignment(db_session, plan, CHAT_HISTORY, "off", actor=SYSTEM)
    db_session.commit()
    events = len(audit_events(db_session))
    response = post_change(client, "/admin/assignments/apply", plan_id=plan.id,
                           kind="assignment", source_key=SAVED, value="off", expected=seen)
    assert response.status_code == 409
    page = response.get_data(as_text=True)
    assert "changed while you were looking" in page
    # The preview shown again is the impact now, with the plan as it is now to confirm.
    assert f'name="expected" value="{plan_fingerprint(plan)}"' in page
    db_session.expire_all()
    assert assignment_value(db_session.get(Plan, plan.id), SAVED) != "off"
    assert len(audit_events(db_session)) == events


def test_reset_to_default_removes_the_row(client, db_session, admin):
    plan = make_plan(db_session, assignments={CHAT_HISTORY: True})
    db_session.commit()
    response = post_change(client, "/admin/assignments/apply", plan_id=plan.id,
                           kind="assignment", source_key=CHAT_HISTORY, value="default",
                           expected=plan_fingerprint(plan))
    assert response.status_code == 303
    assert db_session.scalars(select(SourceAssignment).where(
        SourceAssignment.plan_id == plan.id)).all() == []
    (event,) = audit_events(db_session, "assignment.set")
    assert (event.details["before"], event.details["after"]) == ({"row": "on"},
                                                                 {"row": "default"})


@pytest.mark.parametrize("fields, status", [
    ({"plan_id": "999999999", "kind": "cap", "cap": "2"}, 404),
    ({"plan_id": "x", "kind": "cap", "cap": "2"}, 404),
    ({"plan_id": "", "kind": "cap", "cap": "2"}, 404),
    ({"plan_id": None, "kind": "assignment", "source_key": CHAT_HISTORY, "value": "on"},
     404),
    ({"kind": "other"}, 400),
    ({"kind": "assignment", "source_key": "nope", "value": "on"}, 400),
    ({"kind": "assignment", "source_key": CHAT_HISTORY, "value": "maybe"}, 400),
])
def test_malformed_changes_are_refused(client, db_session, admin, fields, status):
    plan = make_plan(db_session)
    fields = {key: value for key, value in {"plan_id": str(plan.id), **fields}.items()
              if value is not None}
    for path in ("/admin/assignments/preview", "/admin/assignments/apply"):
        assert post_change(client, path, **fields).status_code == status
    assert audit_events(db_session) == []


def test_the_change_needs_the_csrf_token(client, db_session, admin):
    plan = make_plan(db_session)
    response = client.post("/admin/assignments/apply", data={
        "plan_id": plan.id, "kind": "cap", "cap": "4", "expected": plan_fingerprint(plan)})
    assert response.status_code == 400
    assert "security token" in response.get_data(as_text=True)
    assert db_session.get(Plan, plan.id).included_sources == 3


def test_the_plans_list_shows_cap_users_and_what_is_remembered(client, db_session, admin):
    plan = make_plan(db_session, name="Zeta", cap=3)
    for _ in range(4):
        make_user(db_session, plan=plan)
    html = client.get("/admin/plan/?search=Zeta").get_data(as_text=True)
    row = re.search(rf'<tr>(?:(?!</tr>).)*value="{plan.id}"(?:(?!</tr>).)*</tr>', html,
                    re.S).group(0)
    assert "flt0_plan_equals" in row and ">4</a>" in row
    assert "Your profile, Your Blinks, Saved memories" in row  # remembered
    assert "Chat history" in row  # evicted by the cap
    users = client.get(f"/admin/user/?flt0_plan_equals={plan.id}").get_data(as_text=True)
    assert len(re.findall(r">[^<>]*@example\.test\s*<", users)) == 4  # shown, not titles


@pytest.mark.parametrize("path", [MATRIX, "/admin/plan/"])
def test_staff_plan_pages_cost_the_same_queries_for_3_plans_as_for_30(
        client, db_session, admin, count_queries, path):
    def measure():
        client.get(path)  # warm: the session's user, the CSRF secret
        with count_queries() as queries:
            assert client.get(path).status_code == 200
        return queries.count

    for _ in range(3):
        make_user(db_session, plan=make_plan(db_session, assignments={CHAT_HISTORY: True}))
    few = measure()
    for _ in range(27):
        make_user(db_session, plan=make_plan(db_session, assignments={SAVED: False}))
    assert measure() == few


def test_editing_a_plan_records_one_event_with_before_and_after(client, db_session, admin):
    plan = make_plan(db_session, name="Basic")
    token = csrf_from(client, f"/admin/plan/edit/?id={plan.id}")
    response = client.post(f"/admin/plan/edit/?id={plan.id}", data={
        "csrf_token": token, "name": "Basic Plus", "slug": plan.slug, "description": "",
        "monthly_price_cents": "500", "active": "y"})
    assert response.status_code == 302
    (event,) = audit_events(db_session, "plan.update")
    assert event.details == {"before": {"name": "Basic", "monthly_price_cents": 0},
                             "after": {"name": "Basic Plus", "monthly_price_cents": 500}}
    # The cap is not on the edit form: it changes only through the impact preview.
    assert db_session.get(Plan, plan.id).included_sources == 3


def test_a_role_and_plan_change_of_a_user_is_one_event(client, db_session, admin):
    plan = make_plan(db_session)
    target = make_user(db_session)
    token = csrf_from(client, f"/admin/user/edit/?id={target.id}")
    response = client.post(f"/admin/user/edit/?id={target.id}", data={
        "csrf_token": token, "role": "support", "plan_ref": str(plan.id), "active": "y"})
    assert response.status_code == 302
    (event,) = audit_events(db_session, "user.update")
    assert (event.owner_id, event.target_id) == (target.id, str(target.id))
    assert event.details == {"before": {"role": "user", "plan_id": None},
                             "after": {"role": "support", "plan_id": plan.id}}


def test_revoking_keys_is_audited_once_per_key(client, db_session, admin):
    from dashboard.saved_memories.models import ApiKey

    owner = make_user(db_session)
    keys = [ApiKey(owner_id=owner.id, name=f"k{n}", prefix=f"op_test{n}", key_hash="h",
                   scopes=["memory:read"]) for n in range(2)]
    db_session.add_all(keys)
    db_session.flush()
    token = csrf_from(client, "/admin/api_keys/")
    for _ in range(2):  # the second time, nothing is left to revoke
        response = client.post("/admin/api_keys/action/", data={
            "csrf_token": token, "action": "revoke", "rowid": [str(k.id) for k in keys]})
        assert response.status_code == 302
    events = audit_events(db_session, "api_key.revoke")
    assert sorted(e.target_id for e in events) == sorted(str(k.id) for k in keys)
    assert all(e.owner_id == owner.id and e.details["before"] == {"revoked_at": None}
               for e in events)
    db_session.expire_all()
    assert all(db_session.get(ApiKey, k.id).revoked_at is not None for k in keys)


def test_two_admins_at_once_the_second_waits_and_finds_the_plan_changed(app, committed):
    """Two real connections: the second confirm blocks on the plan's row lock while the
    first holds it, then reads the plan as the first left it and applies nothing."""
    import threading

    from sqlalchemy.orm import Session

    from dashboard.extensions import db
    from dashboard.plans.editing import PlanChanged

    plan = committed.plan(cap=3)
    committed.session.commit()
    seen = plan_fingerprint(plan)
    with app.app_context():
        first, second = Session(db.engine), Session(db.engine)
        outcome = {}

        def confirm_second():
            try:
                set_assignment(second, second.get(Plan, plan.id), SAVED, "off", actor=SYSTEM,
                               expected=seen)
                outcome["result"] = "applied"
            except PlanChanged:
                outcome["result"] = "refused"
            finally:
                second.rollback()

        try:
            set_cap(first, first.get(Plan, plan.id), 5, actor=SYSTEM, expected=seen)
            thread = threading.Thread(target=confirm_second)
            thread.start()
            # The second really waits on a lock (not merely runs after the first).
            assert wait_for_lock_wait(first), "the second confirm never waited"
            first.commit()
            thread.join(timeout=10)
            assert outcome == {"result": "refused"}
        finally:
            first.rollback()
            first.close()
            second.close()


def wait_for_lock_wait(session, timeout: float = 10.0) -> bool:
    import time

    from sqlalchemy import text

    from dashboard.extensions import db

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with db.engine.connect() as probe:
            waiting = probe.scalar(text(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database()"))
        if waiting:
            return True
        time.sleep(0.05)
    return False


def test_a_services_confirm_against_another_fingerprint_changes_nothing(db_session):
    from dashboard.plans.editing import PlanChanged

    plan = make_plan(db_session, cap=3, assignments={CHAT_HISTORY: False})
    stale = "cap=3;"
    with pytest.raises(PlanChanged):
        set_assignment(db_session, plan, CHAT_HISTORY, "on", actor=SYSTEM, expected=stale)
    with pytest.raises(PlanChanged):
        set_cap(db_session, plan, 4, actor=SYSTEM, expected=stale)
    assert audit_events(db_session) == []
    set_assignment(db_session, plan, CHAT_HISTORY, "on", actor=SYSTEM,
                   expected=plan_fingerprint(plan))
    set_cap(db_session, plan, 4, actor=SYSTEM, expected=plan_fingerprint(plan))
    assert [e.action for e in audit_events(db_session)] == ["assignment.set", "plan.cap"]
