"""The staff Users list names plans as the Plans list does."""

from __future__ import annotations

from tests.factories import default_plan, make_plan, make_user


def test_a_user_without_a_plan_is_shown_on_the_default_plan_by_its_name(client, auth,
                                                                       db_session):
    default = default_plan(db_session)
    plain = make_user(db_session, email="no-plan@example.test")
    chosen = make_user(db_session, plan=make_plan(db_session, name="Pro test"),
                       email="pro@example.test")
    make_user(db_session, role="admin", email="users-admin@example.test")
    auth.login("users-admin@example.test")
    page = client.get("/admin/user/?search=example.test").get_data(as_text=True)
    assert f"{default.name} (the default)" in page
    assert "Pro test" in page
    assert plain.plan_id is None and chosen.plan_id is not None
