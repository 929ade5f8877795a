"""Staff saves go through validating services: a bad value is a field error, a database
refusal a plain sentence — never SQL, its parameters or a password hash."""

from __future__ import annotations

import logging
import re

import pytest
from sqlalchemy import create_engine, select, text

from dashboard.auth.models import User
from dashboard.plans.models import Plan
from dashboard.staff import SAVE_FAILED
from tests.conftest import csrf_from
from tests.factories import PASSWORD, default_plan, make_plan, make_user

# Never in a log line either: statements, rows, parameters, hashes.
CONTENT_LEAKS = ("INSERT", "UPDATE ", "[SQL", "Failing row", "pbkdf2", "scrypt",
                 "password_hash", "Traceback")
# A page also never names the kind of error (the log does, for the people who fix it).
LEAKS = (*CONTENT_LEAKS, "psycopg", "IntegrityError", "CheckViolation")


def plan_form(plan, **overrides) -> dict:
    data = {"name": plan.name, "slug": plan.slug, "description": "", "included_sources": "3",
            "monthly_price_cents": "0", "active": "y"}
    data.update(overrides)
    return data


def save(client, path: str, data: dict):
    from dashboard.extensions import db

    # What the test made is committed first, as it would be before a real request: a
    # refused save rolls back only its own work.
    db.session.commit()
    return client.post(path, data={**data, "csrf_token": csrf_from(client, path)})


@pytest.fixture
def admin(db_session, auth):
    user = make_user(db_session, role="admin", email="root@example.test")
    auth.login("root@example.test")
    return user


@pytest.mark.parametrize("field, value, message", [
    ("name", "   ", "Give the plan a name."),
    ("slug", "Team Plus", "Use lowercase letters, digits and single dashes"),
    ("slug", "team--plus", "Use lowercase letters, digits and single dashes"),
    ("monthly_price_cents", "-5", "The price cannot be negative."),
])
def test_each_bad_plan_field_is_a_field_error_and_nothing_changes(
        client, db_session, admin, field, value, message):
    plan = make_plan(db_session, name="Original", cap=3)
    path = f"/admin/plan/edit/?id={plan.id}"
    response = save(client, path, plan_form(plan, **{field: value}))
    page = response.get_data(as_text=True)
    assert response.status_code == 200
    assert message in page
    assert re.search(rf'id="{field}"[^>]*is-invalid|is-invalid[^>]*id="{field}"', page) or \
        "invalid-feedback" in page
    db_session.expire_all()
    stored = db_session.get(Plan, plan.id)
    assert (stored.name, stored.slug, stored.included_sources) == ("Original", plan.slug, 3)


@pytest.mark.parametrize("value, message", [
    ("-1", "Choose a whole number from 0 to 5"),
    ("6", "Choose a whole number from 0 to 5"),
    ("2.5", "Not a valid integer value"),
])
def test_a_bad_cap_on_a_new_plan_is_a_field_error_and_nothing_is_created(
        client, db_session, admin, value, message):
    data = {"name": "Fresh", "slug": "fresh", "description": "", "included_sources": value,
            "monthly_price_cents": "0", "active": "y"}
    response = save(client, "/admin/plan/new/", data)
    assert response.status_code == 200
    assert message in response.get_data(as_text=True)
    assert db_session.scalar(select(Plan).where(Plan.slug == "fresh")) is None


def test_plan_names_and_slugs_are_unique_regardless_of_case(client, db_session, admin):
    make_plan(db_session, name="Family")
    other = make_plan(db_session, name="Solo")
    path = f"/admin/plan/edit/?id={other.id}"
    taken = db_session.scalars(text("SELECT slug FROM plans WHERE name = 'Family'")).one()
    assert "Another plan already has that name." in save(
        client, path, plan_form(other, name="  FAMILY ")).get_data(as_text=True)
    response = save(client, path, plan_form(other, slug=taken.upper()))
    assert "Use lowercase letters" in response.get_data(as_text=True)
    response = save(client, path, plan_form(other, slug=taken))
    page = response.get_data(as_text=True)  # Flask-Admin's own check may answer first
    assert "Another plan already has that slug." in page or "Already exists." in page
    db_session.expire_all()
    assert db_session.get(Plan, other.id).slug != taken


def test_the_service_refuses_a_taken_slug_and_a_name_taken_in_another_case(db_session):
    from dashboard.audit.services import SYSTEM
    from dashboard.plans.editing import PlanError, PlanFields, update_plan

    make_plan(db_session, name="Family")
    taken = db_session.scalars(text("SELECT slug FROM plans WHERE name = 'Family'")).one()
    other = make_plan(db_session, name="Solo")
    with pytest.raises(PlanError, match="Another plan already has that slug.") as refused:
        update_plan(db_session, other, PlanFields(name="Solo", slug=taken), actor=SYSTEM)
    assert refused.value.field == "slug"
    with pytest.raises(PlanError, match="Another plan already has that name."):
        update_plan(db_session, other, PlanFields(name="fAMILY", slug="solo-2"),
                    actor=SYSTEM)


def test_the_database_itself_keeps_plan_names_unique_regardless_of_case(db_session):
    from sqlalchemy.exc import IntegrityError

    make_plan(db_session, name="Family")
    with pytest.raises(IntegrityError, match="uq_plans_name_lower"), db_session.begin_nested():
        db_session.add(Plan(name="FAMILY", slug="family-again"))
        db_session.flush()


def test_a_good_plan_edit_is_trimmed_and_saved(client, db_session, admin):
    plan = make_plan(db_session, name="Before")
    response = save(client, f"/admin/plan/edit/?id={plan.id}",
                    plan_form(plan, name="  After  ", included_sources="4"))
    assert response.status_code == 302
    db_session.expire_all()
    # A cap posted to the edit form is ignored: it changes only through the Assignments
    # page, after its impact preview.
    assert (db_session.get(Plan, plan.id).name,
            db_session.get(Plan, plan.id).included_sources) == ("After", 3)


def test_the_default_plan_cannot_be_switched_off(client, db_session, admin):
    free = default_plan(db_session)
    data = plan_form(free)
    del data["active"]
    response = save(client, f"/admin/plan/edit/?id={free.id}", data)
    assert "The default plan stays active" in response.get_data(as_text=True)


def user_form(**values) -> dict:
    return {"role": "user", "plan_ref": "", "active": "y", **values}


def test_a_role_outside_the_three_is_a_field_error(client, db_session, admin):
    target = make_user(db_session)
    for bad in ("Admin", "root", ""):
        response = save(client, f"/admin/user/edit/?id={target.id}", user_form(role=bad))
        page = response.get_data(as_text=True)
        assert response.status_code == 200 and "Not a valid choice" in page
        assert not any(leak in page for leak in LEAKS)
    db_session.expire_all()
    assert db_session.get(User, target.id).role == "user"


def test_a_plan_that_does_not_exist_is_a_field_error(client, db_session, admin):
    target = make_user(db_session)
    response = save(client, f"/admin/user/edit/?id={target.id}", user_form(plan_ref="987654"))
    assert "Not a valid choice" in response.get_data(as_text=True)


def test_nobody_can_remove_the_last_admin(client, db_session, admin):
    path = f"/admin/user/edit/?id={admin.id}"
    for data in (user_form(role="support"), user_form(role="admin", active="")):
        if not data["active"]:
            del data["active"]
        response = save(client, path, data)
        assert "This is the last active admin" in response.get_data(as_text=True)
    db_session.expire_all()
    assert (db_session.get(User, admin.id).role, db_session.get(User, admin.id).active) == \
        ("admin", True)
    # With a second admin, the first may step down.
    make_user(db_session, role="admin")
    assert save(client, path, user_form(role="support")).status_code == 302


@pytest.mark.parametrize("path, status", [
    ("/admin/plan/edit/?id=abc", 404),
    ("/admin/plan/edit/?id=18446744073709551616", 404),
    ("/admin/plan/edit/?id=999999999", 404),
    ("/admin/user/details/?id=-1", 404),
    ("/admin/builds/details/?id=", 404),
    ("/admin/user/?page=-1", 400),
    ("/admin/user/?page=18446744073709551616", 400),
    ("/admin/user/?page_size=100000", 400),
    ("/admin/user/?sort=99", 400),
    ("/admin/builds/?flt0_99=1", 400),
    ("/admin/builds/?flt0_x=1", 400),
])
def test_malformed_ids_pages_and_filters_are_4xx(client, db_session, admin, path, status):
    assert client.get(path).status_code == status


def filter_key(app, endpoint: str, column: str, operation: str) -> str:
    view = app.view_functions[f"{endpoint}.index_view"].__self__
    for key, (_, flt) in view._filter_args.items():
        if str(flt.column).endswith(f".{column}") and flt.operation() == operation:
            return key
    raise LookupError(column)


@pytest.mark.parametrize("endpoint, column, value", [
    ("builds", "user_id", "abc"),
    ("builds", "user_id", "1.5"),
    ("user", "active", "maybe"),
])
def test_a_filter_value_of_the_wrong_kind_is_a_400(app, client, db_session, admin,
                                                   endpoint, column, value):
    key = filter_key(app, endpoint, column, "equals")
    assert client.get(f"/admin/{endpoint}/?flt0_{key}={value}").status_code == 400
    assert client.get(f"/admin/{endpoint}/?flt0_{key}=1").status_code == 200


def test_a_database_refusal_on_save_is_a_plain_sentence_without_sql_or_hash(
        app, committed, caplog):
    """A real refusal from PostgreSQL, whose message quotes the failing row (a password
    hash among its columns): the page and the log carry neither."""
    target = committed.user()
    admin = committed.user(role="admin")
    committed.session.commit()
    hash_fragment = committed.session.get(User, target.id).password_hash[:24]
    committed.session.rollback()  # holds no lock on users while the owner alters it
    owner = create_engine(app.config["MIGRATIONS_DATABASE_URI"])
    with owner.begin() as conn:  # a rule the services do not know about
        conn.execute(text("SET LOCAL lock_timeout = '20s'"))
        conn.execute(text("ALTER TABLE users ADD CONSTRAINT ck_users_test_refusal "
                          "CHECK (active) NOT VALID"))
    try:
        client = app.test_client()
        token = csrf_from(client, "/auth/signin")
        client.post("/auth/signin", data={"email": admin.email, "password": PASSWORD,
                                          "csrf_token": token})
        path = f"/admin/user/edit/?id={target.id}"
        with caplog.at_level(logging.DEBUG):
            response = client.post(path, data={"role": "user", "plan_ref": "",
                                               "csrf_token": csrf_from(client, path)})
        page = response.get_data(as_text=True)
        assert response.status_code == 200
        assert SAVE_FAILED in page
        for leak in (*LEAKS, hash_fragment, "ck_users_test_refusal"):
            assert leak not in page, leak
        for leak in (*CONTENT_LEAKS, hash_fragment, "ck_users_test_refusal"):
            assert leak not in caplog.text, leak
        assert "IntegrityError" in caplog.text  # the kind of error, for whoever fixes it
    finally:
        committed.session.rollback()
        with owner.begin() as conn:
            conn.execute(text("SET LOCAL lock_timeout = '20s'"))
            conn.execute(text("ALTER TABLE users DROP CONSTRAINT ck_users_test_refusal"))
        owner.dispose()
    committed.session.expire_all()
    assert committed.session.get(User, target.id).active is True
