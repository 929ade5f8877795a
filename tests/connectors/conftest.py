"""Fixtures the connector tests share: a signed-in person at the test client, and a
client's metadata document served over HTTPS that the test app is told to trust."""

from __future__ import annotations

import pytest

from tests.connectors.metadata_server import serving_client_document
from tests.factories import make_user


@pytest.fixture
def signed_in(client, auth, db_session):
    user = make_user(db_session)
    assert auth.login(user.email).status_code == 302
    return user


@pytest.fixture
def document(app, monkeypatch, tmp_path):
    """A metadata document on this machine, its CA trusted and its address allowed."""
    with serving_client_document(tmp_path, client_name="ChatGPT (test)") as served:
        monkeypatch.setitem(app.config, "OAUTH_CLIENT_METADATA_CA", str(served.ca_file))
        monkeypatch.setitem(app.config, "OAUTH_CLIENT_METADATA_ALLOW_PRIVATE", True)
        yield served
