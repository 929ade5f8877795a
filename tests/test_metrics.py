"""``GET /metrics``: Prometheus text that the Prometheus client's own parser reads, for staff
or a bearer token only."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from dashboard.memory import verify_memory
from dashboard.memory.models import MemoryVerification
from tests.factories import make_build_record, make_user

parser = pytest.importorskip("prometheus_client.parser",
                             reason="needs prometheus-client: install the dev extra")


def families(response) -> dict[str, dict]:
    """Each family: its type and samples as {labels (sorted tuple): value}."""
    parsed = {}
    for family in parser.text_string_to_metric_families(response.get_data(as_text=True)):
        parsed[family.name] = {"type": family.type, "samples": {
            tuple(sorted(s.labels.items())): s.value for s in family.samples}}
    return parsed


def test_a_guest_is_asked_to_authenticate_and_a_user_is_refused(client, auth, db_session):
    guest = client.get("/metrics")
    assert guest.status_code == 401
    assert guest.headers["WWW-Authenticate"].startswith("Bearer")
    user = make_user(db_session)
    auth.login(user.email)
    assert client.get("/metrics").status_code == 403


def test_staff_read_builds_the_queue_and_the_truth_check(client, auth, db_session):
    support = make_user(db_session, role="support")
    db_session.add_all([make_build_record(support, "failed"), make_build_record(support)])
    before = {s: 0 for s in ("queued", "running", "succeeded", "failed")}
    verify_memory(db_session, ann_threshold=1000, user_ids=[support.id])
    run = db_session.scalars(select(MemoryVerification)
                             .order_by(MemoryVerification.id.desc())).first()
    auth.login(support.email)
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    found = families(response)
    builds = found["orbitpilot_builds"]
    assert builds["type"] == "gauge"
    counts = {dict(labels)["status"]: value for labels, value in builds["samples"].items()}
    assert set(counts) == set(before)
    assert counts["failed"] >= 1 and counts["succeeded"] >= 1
    assert found["orbitpilot_build_queue_up"]["samples"] == {(): 1.0}
    assert () in found["orbitpilot_build_queue_jobs"]["samples"]
    assert found["orbitpilot_truth_check_users_checked"]["samples"] == {
        (): float(run.users_checked)}
    assert found["orbitpilot_truth_check_last_run_timestamp_seconds"]["samples"][()] == \
        pytest.approx(run.finished_at.timestamp())


def test_a_scraper_with_the_token_reads_them_and_a_wrong_token_does_not(
        app, client, monkeypatch):
    monkeypatch.setitem(app.config, "METRICS_TOKEN", "s3cret-token")
    ok = client.get("/metrics", headers={"Authorization": "Bearer s3cret-token"})
    assert ok.status_code == 200 and "orbitpilot_builds" in families(ok)
    for header in ("Bearer wrong", "Basic s3cret-token", "Bearer"):
        assert client.get("/metrics", headers={"Authorization": header}).status_code == 401
    monkeypatch.setitem(app.config, "METRICS_TOKEN", None)
    assert client.get("/metrics", headers={"Authorization": "Bearer "}).status_code == 401
