"""get_user_plan: read once per request (the edge's ``request_plans``), cached for the
request, a plain query outside one."""

from flask_login import login_user

from dashboard.plans.services import get_user_plan, resolve_build_sources
from dashboard.plans.web import request_plans
from tests.factories import make_plan, make_user


def test_get_user_plan_queries_once_per_request(app, db_session, count_queries):
    plan = make_plan(db_session, cap=4, assignments={"blink.blinks": False})
    user = make_user(db_session, plan=plan)
    with app.test_request_context("/"):
        login_user(user)
        with count_queries() as q:
            for _ in range(5):
                assert get_user_plan(user, request_plans()).included_sources == 4
            resolve_build_sources(user, request_plans())
        assert q.count == 1, q.statements
    # A new request reads it again, once.
    with app.test_request_context("/"), count_queries() as q:
        get_user_plan(user, request_plans())
        get_user_plan(user, request_plans())
    assert q.count == 1


def test_default_plan_user_also_costs_one_query(app, db_session, count_queries):
    user = make_user(db_session)
    with app.test_request_context("/"), count_queries() as q:
        assert get_user_plan(user, request_plans()).name == "Free"
        assert resolve_build_sources(user, request_plans()).plan.is_default
    assert q.count == 1


def test_outside_a_request_it_is_a_plain_query_each_time(app, db_session, count_queries):
    user = make_user(db_session, plan=make_plan(db_session, cap=2))
    with count_queries() as q:
        assert get_user_plan(user, request_plans()).included_sources == 2
        assert get_user_plan(user, request_plans()).included_sources == 2
    assert q.count == 2


def test_cached_plan_survives_a_commit_without_new_queries(app, db_session, count_queries):
    user = make_user(db_session, plan=make_plan(db_session, cap=4))
    with app.test_request_context("/"):
        get_user_plan(user, request_plans())
        db_session.commit()  # expires ORM objects; the cached snapshot is plain data
        with count_queries() as q:
            assert get_user_plan(user, request_plans()).included_sources == 4
        assert q.count == 0
