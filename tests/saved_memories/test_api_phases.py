"""Schemathesis' own runner over the API with all its phases — examples, coverage,
fuzzing and stateful (links inferred from ``Location``) — and every check, against a real
server with a real key: the document says exactly what the API accepts (positive data is
accepted, negative data refused), and no check fails. Deterministic and bounded."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from sqlalchemy import delete

from dashboard import create_app
from dashboard import saved_memories as memories
from dashboard.audit.services import Actor
from dashboard.auth.models import User
from dashboard.extensions import db
from dashboard.queues import build_queue
from tests.conftest import make_test_config
from tests.factories import ALL_SCOPES, make_key, make_team, make_user
from tests.live import serving

pytestmark = pytest.mark.processes  # schemathesis' runner in a process of its own

MAX_EXAMPLES = 6
# What a schema-valid request may meet besides success: the key's owner lacks the thing
# (404), its state refuses it (409, 410 once hard-deleted). On the list, a cursor this API
# never gave out is a 422: an opaque string JSON Schema cannot tell from a real one. So
# is a search query with no word to search on (only punctuation, very common words or
# characters no script defines): the document says so, JSON Schema cannot. A
# DELETE forgets (a soft delete unless told otherwise): the memory stays readable, and its
# erasure receipts remain after any forget — by design, not a use after free. A team
# named that the key does not act for (any a generator makes up) is a 404, as on a save.
CONFIG = """
color = false

[generation]
# PostgreSQL stores neither NUL nor a lone surrogate: the API refuses both (400, 422)
# and its strings say so where JSON Schema can (pattern).
allow-x00 = false
codec = "utf-8"
database = "none"

[checks.positive_data_acceptance]
expected-statuses = ["2XX", "401", "403", "404", "409", "410"]

[[operations]]
include-operation-id = "list_memories"
checks.positive_data_acceptance.expected-statuses = ["2XX", "401", "403", "404", "422"]

[[operations]]
include-operation-id = "search_memories"
checks.positive_data_acceptance.expected-statuses = ["2XX", "401", "403", "404", "422"]

# Text of only white space is blank to the service (422), which JSON Schema's pattern
# cannot say the way Python's str.strip() does.
[[operations]]
include-operation-id = "create_memory"
checks.positive_data_acceptance.expected-statuses = ["2XX", "401", "403", "404", "422"]

[[operations]]
include-operation-id = "update_memory"
checks.positive_data_acceptance.expected-statuses = ["2XX", "401", "403", "404", "409",
                                                     "410", "422"]

# A share names the team the key acts for (a made-up one is the same 404 as an unknown
# memory, which the stateful checks would take for a lost resource).
[[operations]]
include-operation-id = "share_memory"
parameters = { "body.team" = { dictionary = "teams" } }

[dictionaries]
teams = { values = ["{team}"] }

[checks.use_after_free]
enabled = false

[parameters]
marker_id = {marker_id}
"""


@pytest.fixture
def live_api(app):
    """A second app on the test database, its own queue, and a committed owner whose key
    holds every scope (memory:hard_delete granted as an admin would), with memories and
    one erasure receipt; all removed afterwards."""
    live = create_app(make_test_config(SERVER_NAME=None, API_RATE_LIMIT="100000 per minute",
                                       BUILD_QUEUE=f"builds-phases-{os.getpid()}"))
    with live.app_context():
        session = db.session
        owner = make_user(session)
        team = make_team(session, owner)
        _, raw = make_key(session, owner, scopes=ALL_SCOPES, name="schemathesis",
                          team_ids=[team.id])
        actor = Actor.of(owner)
        saved = [memories.save_memory(session, owner=owner, content=f"Memory {i}.",
                                      actor=actor).memory for i in range(4)]
        receipt = memories.forget_memory(session, owner.id, saved[0].id,
                                         mode="soft_delete", actor=actor)
        owner_id, team_id, slug = owner.id, team.id, team.slug
        session.commit()
    try:
        with serving(live) as url:
            yield url, raw, receipt.marker_id, slug
    finally:
        with live.app_context():
            db.session.rollback()
            db.session.execute(delete(User).where(User.id.in_([owner_id, team_id])))
            db.session.commit()
            db.session.remove()
            queue = build_queue(live).rq()
            queue.empty()
            queue.delete(delete_jobs=True)
            db.engine.dispose()


def test_every_phase_and_every_check_pass(live_api, tmp_path):
    url, raw, marker_id, team = live_api
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG.replace("{marker_id}", str(marker_id)).replace("{team}", team))
    run = subprocess.run(
        [sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "run",
         f"{url}/v1/openapi.json", "-H", f"X-API-Key: {raw}",
         "--phases", "examples,coverage,fuzzing,stateful",
         "--max-examples", str(MAX_EXAMPLES), "--generation-deterministic",
         "--suppress-health-check", "all"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600)
    report = run.stdout + run.stderr
    assert run.returncode == 0, report[-12000:]
    for phase in ("Coverage", "Fuzzing", "Stateful"):
        assert f"✅ {phase}" in report, report[-4000:]  # ran, and passed
