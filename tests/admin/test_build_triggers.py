"""Admin-triggered builds (one user, whole plans) and the user's "update my memory now"."""


from dashboard.memory import fan_out_plan_builds
from tests.conftest import csrf_from
from tests.factories import builds_of, make_plan, make_user


def test_admin_action_requests_builds_for_selected_users(client, db_session, auth):
    admin = make_user(db_session, role="admin", email="root@example.test")
    a, b = make_user(db_session), make_user(db_session)
    auth.login("root@example.test")
    token = csrf_from(client, "/admin/user/")
    response = client.post("/admin/user/action/", data={
        "action": "build_full", "rowid": [str(a.id), str(b.id)], "csrf_token": token})
    assert response.status_code == 302
    for user in (a, b):
        (build,) = builds_of(db_session, user.id)
        assert (build.mode, build.trigger, build.requested_by_id) == ("full", "admin", admin.id)


def test_admin_action_fans_out_over_a_plan_through_a_job(client, db_session, auth, queue):
    admin = make_user(db_session, role="admin", email="root@example.test")
    plan = make_plan(db_session)
    members = [make_user(db_session, plan=plan) for _ in range(3)]
    outsider = make_user(db_session)
    auth.login("root@example.test")
    queue.empty()
    token = csrf_from(client, "/admin/plan/")
    response = client.post("/admin/plan/action/", data={
        "action": "build_full", "rowid": [str(plan.id)], "csrf_token": token})
    assert response.status_code == 302
    # The request itself requested no build: one job per plan does, in the background.
    assert all(builds_of(db_session, u.id) == [] for u in members)
    (job,) = [queue.fetch_job(job_id) for job_id in queue.job_ids]
    assert (job.func_name, job.args) == ("jobs.builds.fan_out_plan", (plan.id,))
    assert job.kwargs == {"mode": "full", "trigger": "admin", "requested_by_id": admin.id}
    assert fan_out_plan_builds(db_session, *job.args, batch_size=500, **job.kwargs) == 3
    for user in members:
        (build,) = builds_of(db_session, user.id)
        assert (build.mode, build.trigger, build.requested_by_id) == ("full", "admin", admin.id)
    assert builds_of(db_session, outsider.id) == []


def test_admin_actions_need_the_token(client, db_session, auth):
    make_user(db_session, role="admin", email="root@example.test")
    target = make_user(db_session)
    auth.login("root@example.test")
    response = client.post("/admin/user/action/", data={"action": "build_full",
                                                        "rowid": [str(target.id)]})
    assert response.status_code == 400
    assert "security token" in response.get_data(as_text=True)
    assert builds_of(db_session, target.id) == []


def test_admin_actions_need_the_admin_role(client, db_session, auth):
    make_user(db_session, role="support", email="help@example.test")
    target = make_user(db_session)
    auth.login("help@example.test")
    response = client.post("/admin/user/action/", data={
        "action": "build_full", "rowid": [str(target.id)], "csrf_token": csrf_from(client, "/")})
    assert response.status_code == 403
    assert builds_of(db_session, target.id) == []


def test_update_my_memory_now_is_rate_limited(client, db_session, auth):
    user = make_user(db_session, email="me@example.test")
    auth.login("me@example.test")
    token = csrf_from(client, "/")
    first = client.post("/memory/update", data={"csrf_token": token})
    assert first.status_code == 303
    assert [b.trigger for b in builds_of(db_session, user.id)] == ["user"]
    second = client.post("/memory/update", data={"csrf_token": token}, follow_redirects=True)
    assert "you can ask again in" in second.get_data(as_text=True)
    assert len(builds_of(db_session, user.id)) == 1


def test_update_needs_sign_in_and_csrf(client, db_session, auth):
    assert client.post("/memory/update",
                       data={"csrf_token": csrf_from(client, "/auth/signin")}).status_code == 302
    make_user(db_session, email="me@example.test")
    auth.login("me@example.test")
    assert client.post("/memory/update").status_code == 400
