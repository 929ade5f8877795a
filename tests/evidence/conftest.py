"""What the evidence tests share: the app's answers to the probes (asked once per
module: they read no row), a context to run a check in, and a strong password hash."""

from __future__ import annotations

import pytest
from werkzeug.security import generate_password_hash

from dashboard.evidence import checks
from dashboard.evidence.web import probe_app


@pytest.fixture(scope="module")
def probes(app) -> checks.AppProbes:
    with app.app_context():
        return probe_app(app)


@pytest.fixture(scope="module")
def strong_hash() -> str:
    return generate_password_hash("Qz7!vR2#mK9$wT4%")


@pytest.fixture
def ctx(app, db_session, probes):
    def make(session=None, **changes) -> checks.Context:
        from dataclasses import replace

        return checks.Context(session or db_session, app.config, replace(probes, **changes))

    return make


from tests.audit.conftest import owner_session  # noqa: E402,F401  (the tampering tests' owner)
