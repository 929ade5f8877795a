"""Every staff URL and action against every identity, each with the one status expected.

guest → the sign-in page (302), user → 403, support → the read-only pages (support
explorer, builds, audit log) and 403 elsewhere, admin → everything. Operations a list
does not offer are 404 for everyone who may see the list; unknown actions are 400.
Every POST carries a valid CSRF token, so a status here is never a CSRF refusal.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from dashboard.audit.services import SYSTEM, record_event
from dashboard.memory import MemoryBuild
from dashboard.plans.impact import plan_fingerprint
from dashboard.saved_memories.models import ApiKey
from dashboard.sources import CHAT_HISTORY
from tests.conftest import csrf_from
from tests.factories import make_plan, make_user

IDENTITIES = ("guest", "user", "support", "admin")
# Who may see what: the statuses of a page readable by admins only, by staff, or never.
ADMIN_ONLY = {"guest": 302, "user": 403, "support": 403, "admin": 200}
STAFF = {"guest": 302, "user": 403, "support": 200, "admin": 200}


def admin_only(admin_status: int) -> dict[str, int]:
    return {**ADMIN_ONLY, "admin": admin_status}


def staff(status: int) -> dict[str, int]:
    return {**STAFF, "support": status, "admin": status}


@dataclass(frozen=True)
class World:
    fingerprint: str
    plan: int
    user: int
    key: int
    build: int
    event: int


@pytest.fixture
def world(db_session) -> World:
    plan = make_plan(db_session, name="Matrix plan")
    target = make_user(db_session, plan=plan, email="matrix-target@example.test")
    key = ApiKey(owner_id=target.id, name="matrix", prefix="op_matrix", key_hash="x",
                 scopes=["memory:read"])
    build = MemoryBuild(user_id=target.id, mode="quick", trigger="user", status="succeeded")
    db_session.add_all([key, build])
    db_session.flush()
    event = record_event(db_session, action="plan.update", actor=SYSTEM, target_type="plan",
                         target_id=plan.id, details={"before": {"name": "a"},
                                                     "after": {"name": "b"}})
    for role in ("user", "support", "admin"):
        make_user(db_session, role=role, email=f"matrix-{role}@example.test")
    db_session.commit()
    return World(plan_fingerprint(plan), plan.id, target.id, key.id, build.id, event.id)


def get_cases(w: World) -> list[tuple[str, dict[str, int]]]:
    return [
        ("/admin/", STAFF),
        # Plans: admins only; no delete, no export.
        ("/admin/plan/", ADMIN_ONLY),
        ("/admin/plan/?search=Matrix", ADMIN_ONLY),
        ("/admin/plan/new/", ADMIN_ONLY),
        (f"/admin/plan/edit/?id={w.plan}", ADMIN_ONLY),
        (f"/admin/plan/details/?id={w.plan}", ADMIN_ONLY),
        ("/admin/plan/details/?id=abc", admin_only(404)),
        ("/admin/plan/details/?id=99999999999", admin_only(404)),
        ("/admin/plan/export/csv/", admin_only(404)),
        ("/admin/plan/?page=-1", admin_only(400)),
        ("/admin/plan/?sort=99", admin_only(400)),
        # Users.
        ("/admin/user/", ADMIN_ONLY),
        (f"/admin/user/?flt0_plan_equals={w.plan}", ADMIN_ONLY),
        ("/admin/user/?flt0_plan_equals=abc", admin_only(400)),
        (f"/admin/user/edit/?id={w.user}", ADMIN_ONLY),
        (f"/admin/user/details/?id={w.user}", ADMIN_ONLY),
        ("/admin/user/new/", admin_only(404)),
        ("/admin/user/edit/?id=", admin_only(404)),
        # Assignments.
        ("/admin/assignments/", ADMIN_ONLY),
        # API keys: list, details, revoke; nothing else.
        ("/admin/api_keys/", ADMIN_ONLY),
        (f"/admin/api_keys/details/?id={w.key}", ADMIN_ONLY),
        ("/admin/api_keys/new/", admin_only(404)),
        (f"/admin/api_keys/edit/?id={w.key}", admin_only(404)),
        ("/admin/api_keys/?flt0_nope=1", admin_only(400)),
        # Builds and the audit log: staff read them; nobody changes them.
        ("/admin/builds/", STAFF),
        (f"/admin/builds/details/?id={w.build}", STAFF),
        (f"/admin/builds/?flt0_user_id_equals={w.user}", STAFF),
        ("/admin/builds/?flt0_user_id_equals=abc", staff(400)),
        ("/admin/builds/new/", staff(404)),
        (f"/admin/builds/edit/?id={w.build}", staff(404)),
        ("/admin/builds/details/?id=-1", staff(404)),
        ("/admin/audit/", STAFF),
        (f"/admin/audit/details/?id={w.event}", STAFF),
        ("/admin/audit/export/csv/", STAFF),
        ("/admin/audit/new/", staff(404)),
        (f"/admin/audit/edit/?id={w.event}", staff(404)),
        ("/admin/audit/details/?id=abc", staff(404)),
        ("/admin/audit/?page=abc", staff(400)),
        ("/admin/markers/", STAFF),
        ("/admin/markers/?flt0_mode_equals=redact", STAFF),
        ("/admin/markers/?flt0_owner_id_equals=abc", staff(400)),
        ("/admin/markers/new/", staff(404)),
        ("/admin/markers/details/?id=abc", staff(404)),
        ("/admin/markers/export/csv/", staff(404)),
        # The support explorer.
        ("/settings/keys/", {"guest": 302, "user": 200, "support": 200, "admin": 200}),
        ("/support/", STAFF),
        ("/support/plans", STAFF),
        (f"/support/users/{w.user}", STAFF),
        ("/support/users/99999999999999999999", staff(404)),
        ("/support/users/abc", {"guest": 404, "user": 404, "support": 404, "admin": 404}),
    ]


def post_cases(w: World) -> list[tuple[str, dict, dict[str, int]]]:
    plan_form = {"name": "Matrix plan", "slug": "matrix-plan-x", "description": "",
                 "monthly_price_cents": "0", "active": "y"}
    return [
        ("/admin/plan/new/", {**plan_form, "name": "Matrix new", "slug": "matrix-new",
                              "included_sources": "3"}, admin_only(302)),
        (f"/admin/plan/edit/?id={w.plan}", plan_form, admin_only(302)),
        ("/admin/plan/action/", {"action": "build_quick", "rowid": str(w.plan)},
         admin_only(302)),
        ("/admin/plan/action/", {"action": "nope", "rowid": str(w.plan)}, admin_only(400)),
        ("/admin/plan/delete/", {"id": str(w.plan)}, admin_only(404)),
        (f"/admin/user/edit/?id={w.user}", {"role": "user", "plan_ref": "", "active": "y"},
         admin_only(302)),
        ("/admin/user/action/", {"action": "build_full", "rowid": str(w.user)},
         admin_only(302)),
        ("/admin/user/delete/", {"id": str(w.user)}, admin_only(404)),
        ("/admin/api_keys/action/", {"action": "revoke", "rowid": str(w.key)},
         admin_only(302)),
        ("/admin/api_keys/action/", {"action": "revoke", "rowid": "abc"}, admin_only(400)),
        ("/admin/api_keys/action/", {"action": "grant_hard_delete", "rowid": str(w.key)},
         admin_only(302)),
        ("/admin/api_keys/delete/", {"id": str(w.key)}, admin_only(404)),
        ("/admin/assignments/preview", {"plan_id": str(w.plan), "kind": "assignment",
                                        "source_key": CHAT_HISTORY, "value": "off"},
         admin_only(200)),
        ("/admin/assignments/apply", {"plan_id": str(w.plan), "kind": "assignment",
                                      "source_key": CHAT_HISTORY, "value": "off",
                                      "expected": w.fingerprint}, admin_only(303)),
        ("/admin/assignments/apply", {"plan_id": str(w.plan), "kind": "cap", "cap": "9",
                                      "expected": w.fingerprint}, admin_only(400)),
        ("/admin/builds/action/", {"action": "delete", "rowid": str(w.build)}, staff(400)),
        ("/admin/builds/delete/", {"id": str(w.build)}, staff(404)),
        (f"/admin/builds/edit/?id={w.build}", {"status": "failed"}, staff(404)),
        ("/admin/builds/ajax/update/", {"list_form_pk": str(w.build), "status": "failed"},
         staff(404)),
        ("/admin/audit/action/", {"action": "delete", "rowid": str(w.event)}, staff(400)),
        ("/admin/audit/delete/", {"id": str(w.event)}, staff(404)),
        ("/admin/audit/new/", {"action": "forged"}, staff(404)),
        ("/admin/audit/ajax/update/", {"list_form_pk": str(w.event), "action": "x"},
         staff(404)),
    ]


def sign_in(client, auth, identity: str) -> str:
    """Sign in as ``identity``; returns a CSRF token valid for this session."""
    if identity == "guest":
        return csrf_from(client, "/auth/signin")
    response = auth.login(f"matrix-{identity}@example.test")
    assert response.status_code == 302
    return csrf_from(client, "/")


@pytest.mark.parametrize("identity", IDENTITIES)
def test_every_staff_page(client, auth, world, identity):
    sign_in(client, auth, identity)
    wrong = []
    for path, expected in get_cases(world):
        status = client.get(path).status_code
        if status != expected[identity]:
            wrong.append(f"GET {path}: {status}, expected {expected[identity]}")
    assert wrong == []


@pytest.mark.parametrize("identity", IDENTITIES)
def test_every_staff_action(client, auth, db_session, world, identity):
    token = sign_in(client, auth, identity)
    wrong = []
    for path, data, expected in post_cases(world):
        response = client.post(path, data={**data, "csrf_token": token})
        if response.status_code != expected[identity]:
            wrong.append(f"POST {path} {data}: {response.status_code}, "
                         f"expected {expected[identity]}")
        if identity == "guest" and response.status_code == 302:
            assert "/auth/signin" in response.headers["Location"]
    assert wrong == []


def test_without_a_token_every_staff_action_is_refused_as_such(client, auth, world):
    sign_in(client, auth, "admin")
    for path, data, _ in post_cases(world):
        response = client.post(path, data=data)
        assert response.status_code == 400, path
        assert "security token" in response.get_data(as_text=True)
