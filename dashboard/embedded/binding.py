"""The app's binding to the embedded servers: each starts on its first real use (a
database connection, a Redis client, a request), never when the app is created."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any

from dashboard.embedded.errors import EmbeddedError
from dashboard.embedded.postgres import ensure_database
from dashboard.embedded.services import EmbeddedServices


@dataclass
class EmbeddedBinding:
    """What an app takes from the embedded servers, each started on its first real use:
    a database connection starts PostgreSQL, a Redis client Valkey (so a health check
    of one never fails because the other could not start)."""

    services: EmbeddedServices
    postgres: bool
    redis: bool
    database: str
    _ready: dict[str, int] = field(default_factory=dict)  # component -> pid that readied it
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def ensure_postgres(self) -> None:
        if self.postgres:
            self._ensure("postgres")

    def ensure_redis(self) -> None:
        if self.redis:
            self._ensure("redis")

    def ensure_started(self) -> None:
        self.ensure_postgres()
        self.ensure_redis()

    def revive_redis(self) -> bool:
        """Start the embedded Valkey again if it stopped answering (killed, crashed):
        ``ensure_redis`` readies it once per process and cannot see that. Under the
        folder's lock like every start, so processes that notice at once start one
        server between them. True if it was down and answers now (started again by
        this process or another)."""
        if not self.redis or self.services.valkey.answers():
            return False
        # Not under self._lock: a work horse forked while another thread held it would
        # inherit it held, for good. The file lock orders the start anyway.
        self._make_ready("redis")
        return True

    def _ensure(self, component: str) -> None:
        # Once per process: forks (work horses, gunicorn workers) hold on their own.
        if self._ready.get(component) == os.getpid():
            return
        with self._lock:
            if self._ready.get(component) == os.getpid():
                return
            self._make_ready(component)

    def _make_ready(self, component: str) -> None:
        try:
            urls = self.services.ensure(postgres=component == "postgres",
                                        redis=component == "redis")
            if component == "postgres":
                ensure_database(urls.postgres_admin, self.database)
        except EmbeddedError:
            raise
        except Exception as exc:  # psycopg, OSError: a sentence, not their text
            raise EmbeddedError(f"the embedded {component} could not be made ready "
                                f"({type(exc).__name__})") from exc
        self._ready[component] = os.getpid()


def ensure_started(app: Any) -> None:
    """Start the app's embedded servers if it uses them and they are not up yet."""
    binding = app.extensions.get("orbitpilot.embedded")
    if binding is not None:
        binding.ensure_started()
