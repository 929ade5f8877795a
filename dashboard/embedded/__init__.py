"""The embedded default: a real PostgreSQL (with pgvector) and a real Valkey server under
one folder, shared by every process that uses them and started on first use. This is the
package's front door: code outside it imports from here only. The design and its reasons
are in docs/architecture/embedded.md."""

from dashboard.embedded.binding import EmbeddedBinding, ensure_started
from dashboard.embedded.errors import EmbeddedError
from dashboard.embedded.postgres import APP_ROLE, OWNER_ROLE, ensure_database
from dashboard.embedded.processes import become_subreaper, die_with_parent, pid_alive
from dashboard.embedded.services import EmbeddedServices, EmbeddedUrls, get_services

__all__ = [
    "APP_ROLE",
    "OWNER_ROLE",
    "EmbeddedBinding",
    "EmbeddedError",
    "EmbeddedServices",
    "EmbeddedUrls",
    "ensure_database",
    "ensure_started",
    "get_services",
    "become_subreaper",
    "die_with_parent",
    "pid_alive",
]
