"""Each check measured now: a query, a probe or a read-back, never a copy of a setting
taken on trust. A check is ids, counts, flags and versions — never content. What only a
running app can show (its responses, its URL map, its limiter, its OAuth server) comes in
as ``AppProbes``, measured by the edge (``evidence.web``)."""

from __future__ import annotations

import platform
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import any_, func, literal, select, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from dashboard.audit.anchors import Anchoring, read_anchors
from dashboard.audit.services import chain_id, verify_chain
from dashboard.auth.models import User
from dashboard.auth.services import password_problem
from dashboard.connectors import services as connectors
from dashboard.connectors.models import OAuthClient, OAuthGrant
from dashboard.database import APPEND_ONLY_TABLES
from dashboard.evidence.controls import BY_ID, criteria
from dashboard.evidence.models import EvidenceDrill
from dashboard.holds.models import LegalHold
from dashboard.memory import last_verification
from dashboard.plans.models import Plan
from dashboard.roles import ROLES, STAFF_ROLES
from dashboard.saved_memories.models import SCOPES, ApiKey, ForgetMarker
from dashboard.teams.models import Team, TeamApp, TeamMember

HARD_DELETE = "memory:hard_delete"
# The chain identity row is refused changes like the log itself (migration 0018).
AUDIT_TABLES = (*APPEND_ONLY_TABLES, "audit_chain")
# Headers every page must carry (security.py sets them; the probe reads them back).
REQUIRED_HEADERS = ("Content-Security-Policy", "X-Frame-Options", "X-Content-Type-Options",
                    "Referrer-Policy")
# Bounds a token lifetime must keep within (seconds).
MAX_LIFETIMES = {"access": 3600, "code": 600, "refresh": 90 * 86400}
# A drill older than this no longer evidences the deletion path.
DRILL_MAX_AGE = timedelta(days=90)
MIN_POSTGRES = 14


@dataclass(frozen=True)
class AppProbes:
    """What the running app answered (``evidence.web.probe_app``)."""

    headers: dict[str, str]  # GET of a page over HTTP
    tls_headers: dict[str, str]  # the same over HTTPS
    cookie: dict[str, Any] | None  # the session cookie's flags, as set
    csrf_status: int  # a POST without its token
    oversize_status: int  # a POST declaring one byte more than the body limit
    max_content_length: int | None
    limits: dict[str, str]  # limiter scope -> its limit, as the limiter gives it
    pkce: dict[str, bool]  # what the registered grant refused or took
    redirects: dict[str, bool]  # probe URI -> accepted for a client registering one
    refresh_rotates: bool
    lifetimes: dict[str, int]  # seconds
    mutating_rules: list[str]  # routes outside the API taking PUT/PATCH/DELETE
    served_over_tls: bool


@dataclass(frozen=True)
class Check:
    id: str
    passed: bool
    summary: str
    measured: dict[str, Any]
    method: str
    at: str

    def as_dict(self) -> dict[str, Any]:
        control = BY_ID[self.id]
        return {"id": self.id, "area": control.area, "title": control.title,
                "status": "pass" if self.passed else "fail", "passed": self.passed,
                "summary": self.summary, "measured": self.measured, "method": self.method,
                "measured_at": self.at, "criteria": criteria(self.id)}


def _has(column: Any, value: Any) -> Any:
    """``value`` is one of the array ``column``'s elements."""
    return literal(value) == any_(column)


def stamp(moment: datetime | None = None) -> str:
    return (moment or datetime.now(UTC)).astimezone(UTC).isoformat(timespec="seconds")


def _check(check_id: str, passed: bool, summary: str, measured: dict[str, Any],
           method: str) -> Check:
    return Check(check_id, bool(passed), summary, measured, method, stamp())


@dataclass
class Context:
    """What every check reads: the session, the app's settings, the app's answers."""

    session: Session
    config: Mapping[str, Any]
    probes: AppProbes
    now: datetime = field(default_factory=lambda: datetime.now(UTC))


# -- access -------------------------------------------------------------------------------

def _hash_scheme(stored: str) -> str:
    # werkzeug: "scrypt:32768:8:1$salt$hash", "pbkdf2:sha256:600000$salt$hash".
    return stored.split("$", 1)[0] if "$" in stored else "unusable"


def _strong(scheme: str) -> bool:
    if scheme.startswith("scrypt:"):
        return True
    match = re.fullmatch(r"pbkdf2:sha(256|512):(\d+)", scheme)
    return bool(match) and int(match.group(2)) >= 600_000


_PROBE_PASSWORD = "Qz7!vR2#mK9$wT4%"


def check_passwords(ctx: Context) -> Check:
    schemes: dict[str, int] = {}
    for stored, count in ctx.session.execute(
            select(User.password_hash, func.count()).where(User.kind == "person")
            .group_by(User.password_hash)):
        scheme = _hash_scheme(stored)
        schemes[scheme] = schemes.get(scheme, 0) + count
    weak = {s: n for s, n in schemes.items() if s != "unusable" and not _strong(s)}
    minimum = int(ctx.config["PASSWORD_MIN_LENGTH"])
    # The policy probed: a password one character short is refused, one long enough taken.
    probe = (_PROBE_PASSWORD * (minimum // len(_PROBE_PASSWORD) + 1))[:minimum]
    short_refused = password_problem(probe, "", minimum) is None and \
        password_problem(probe[:-1], "", minimum) is not None
    passed = not weak and short_refused and minimum >= 10
    return _check("access.passwords", passed,
                  "Every stored password uses scrypt or PBKDF2 (≥ 600,000 rounds); a "
                  f"password under {minimum} characters is refused." if passed else
                  f"Weak password hashes: {weak or 'none'}; minimum length {minimum}, "
                  f"short password refused: {short_refused}.",
                  {"hash_schemes": {s.split(':')[0]: n for s, n in sorted(schemes.items())},
                   "weak_hashes": sum(weak.values()), "min_length": minimum,
                   "short_password_refused": short_refused},
                  "census of stored hash schemes; the sign-up policy called with a short "
                  "and a long enough password")


def check_signin_throttle(ctx: Context) -> Check:
    limits = ctx.probes.limits
    needed = ("signin-account", "signin-client")
    missing = [scope for scope in needed if not limits.get(scope)]
    return _check("access.signin_throttle", not missing,
                  "Failed sign-ins are throttled per account and per client address."
                  if not missing else f"No sign-in limit for: {', '.join(missing)}.",
                  {"limits": dict(sorted(limits.items()))},
                  "the limits read back from the app's rate limiter")


def check_session_cookies(ctx: Context) -> Check:
    cookie = ctx.probes.cookie or {}
    tls = ctx.probes.tls_headers
    hsts = tls.get("Strict-Transport-Security", "")
    problems = []
    if not cookie:
        problems.append("no session cookie was set")
    else:
        if not cookie.get("httponly"):
            problems.append("the session cookie lacks HttpOnly")
        if (cookie.get("samesite") or "").lower() not in ("lax", "strict"):
            problems.append("the session cookie lacks SameSite=Lax or Strict")
        if ctx.probes.served_over_tls and not cookie.get("secure"):
            problems.append("served over TLS, but the session cookie lacks Secure")
    if not hsts.startswith("max-age=") or int(re.sub(r"\D.*", "", hsts[8:]) or 0) < 86400:
        problems.append("no Strict-Transport-Security of at least a day over HTTPS")
    return _check("access.session_cookies", not problems,
                  "The session cookie is HttpOnly and SameSite; HTTPS responses carry HSTS."
                  if not problems else "; ".join(problems).capitalize() + ".",
                  {"cookie": cookie, "hsts": hsts or None,
                   "served_over_tls": ctx.probes.served_over_tls},
                  "an internal GET of the sign-in page over HTTP and over HTTPS")


def check_staff(ctx: Context) -> Check:
    counts = dict(ctx.session.execute(
        select(User.role, func.count()).where(User.active.is_(True), User.kind == "person")
        .group_by(User.role)).all())
    by_role = {role: int(counts.get(role, 0)) for role in ROLES}
    weak = ctx.session.scalar(
        select(func.count()).select_from(User).where(
            User.role.in_(STAFF_ROLES), User.active.is_(True),
            ~User.password_hash.like("scrypt:%"), ~User.password_hash.like("pbkdf2:%")))
    passed = by_role["admin"] >= 1 and not weak
    return _check("access.staff", passed,
                  f"{by_role['admin']} admin and {by_role['support']} support account(s), "
                  "each with a strong password hash." if passed else
                  f"{by_role['admin']} admin account(s); {weak} staff account(s) without a "
                  "strong password hash.",
                  {"active_accounts_by_role": by_role, "staff_without_strong_hash": weak},
                  "count of active accounts by role")


def check_api_keys(ctx: Context) -> Check:
    live = (ApiKey.revoked_at.is_(None),
            (ApiKey.expires_at.is_(None)) | (ApiKey.expires_at > ctx.now))
    by_scope = {scope: int(ctx.session.scalar(
        select(func.count()).select_from(ApiKey).where(*live, _has(ApiKey.scopes, scope))))
        for scope in SCOPES}
    total = int(ctx.session.scalar(select(func.count()).select_from(ApiKey).where(*live)))
    no_expiry = int(ctx.session.scalar(select(func.count()).select_from(ApiKey).where(
        *live, ApiKey.expires_at.is_(None))))
    hard_no_expiry = int(ctx.session.scalar(select(func.count()).select_from(ApiKey).where(
        *live, ApiKey.expires_at.is_(None), _has(ApiKey.scopes, HARD_DELETE))))
    passed = hard_no_expiry == 0
    return _check("access.api_keys", passed,
                  f"{total} live key(s); {by_scope[HARD_DELETE]} may hard delete, each with "
                  "an expiry." if passed else
                  f"{hard_no_expiry} live key(s) able to hard delete never expire.",
                  {"live_keys": total, "by_scope": by_scope, "without_expiry": no_expiry,
                   "hard_delete_without_expiry": hard_no_expiry},
                  "count of live (unrevoked, unexpired) API keys")


def check_oauth_pkce(ctx: Context) -> Check:
    pkce = ctx.probes.pkce
    passed = (pkce.get("plain_refused") is True and pkce.get("missing_refused") is True
              and pkce.get("s256_accepted") is True)
    return _check("access.oauth_pkce", passed,
                  "PKCE is required and only S256 is taken: plain was refused."
                  if passed else "The authorization server took a weaker PKCE: "
                  + ", ".join(f"{k}={v}" for k, v in sorted(pkce.items())) + ".",
                  {"probe": dict(sorted(pkce.items()))},
                  "the registered authorization-code grant's PKCE check, called with "
                  "plain, with none and with S256")


def check_oauth_redirects(ctx: Context) -> Check:
    taken = ctx.probes.redirects
    exact = [uri for uri, ok in taken.items() if uri.endswith("#exact")]
    wrong = [uri for uri, ok in taken.items() if ok and not uri.endswith("#exact")]
    passed = bool(exact) and all(taken[uri] for uri in exact) and not wrong
    return _check("access.oauth_redirects", passed,
                  "Only the exact registered redirect URI is taken." if passed else
                  f"Redirect URIs taken that differ from the registered one: {len(wrong)}.",
                  {"probe": {uri.removesuffix("#exact"): ok for uri, ok in taken.items()}},
                  "a client registering https://client.example/cb, asked for near misses")


def probe_refresh_reuse(session: Session) -> dict[str, bool]:
    """A connection made, its refresh token rotated, then the old one presented again —
    all in a savepoint that is rolled back. Reuse detection: the old token is refused and
    the whole connection revoked, so the new token is refused too."""
    savepoint = session.begin_nested()
    result: dict[str, bool]
    try:
        person = User(email="evidence-probe@sandbox.orbitpilot.invalid", password_hash="!",
                      display_name="Evidence probe", role="user")
        session.add(person)
        session.flush()
        client, _ = connectors.register_client(session, {
            "client_name": "Evidence probe", "redirect_uris": ["https://client.example/cb"],
            "token_endpoint_auth_method": "none"})
        grant = connectors.consent(session, user=person, client=client,
                                   scopes=["memory:read"], resource="https://probe.invalid/mcp",
                                   allowed=True)
        lifetimes = connectors.Lifetimes()
        first = connectors.new_secret(connectors.REFRESH_PREFIX)
        token = connectors.store_tokens(
            session, grant, access=connectors.new_secret(connectors.ACCESS_PREFIX),
            refresh=first, scopes=["memory:read"], lifetimes=lifetimes)
        second = connectors.new_secret(connectors.REFRESH_PREFIX)
        connectors.store_tokens(
            session, grant, access=connectors.new_secret(connectors.ACCESS_PREFIX),
            refresh=second, scopes=["memory:read"], lifetimes=lifetimes, parent=token)
        old_refused = connectors.find_refresh(session, first, client) is None
        session.flush()
        revoked = session.scalar(select(OAuthGrant.revoked_at)
                                 .where(OAuthGrant.id == grant.id)) is not None
        new_refused = connectors.find_refresh(session, second, client) is None
        result = {"old_refresh_refused": old_refused, "connection_revoked": revoked,
                  "new_refresh_refused_after": new_refused}
    except Exception:  # a probe that cannot run proves nothing: the check fails
        result = {"probe_ran": False}
    savepoint.rollback()
    return result


def check_oauth_tokens(ctx: Context) -> Check:
    lifetimes = ctx.probes.lifetimes
    too_long = {k: v for k, v in lifetimes.items() if v > MAX_LIFETIMES.get(k, 0)}
    reuse = probe_refresh_reuse(ctx.session)
    passed = ctx.probes.refresh_rotates and all(reuse.values()) and not too_long
    return _check("access.oauth_tokens", passed,
                  "Refresh tokens rotate on use and a reused one revokes the connection "
                  "(probed); lifetimes are within bounds." if passed else
                  f"Refresh rotation: {ctx.probes.refresh_rotates}; reuse probe: "
                  + ", ".join(f"{k}={v}" for k, v in reuse.items())
                  + f"; lifetimes over bounds: {too_long or 'none'}.",
                  {"refresh_rotates": ctx.probes.refresh_rotates, "reuse_probe": reuse,
                   "lifetimes_seconds": lifetimes, "bounds_seconds": MAX_LIFETIMES},
                  "the running server's refresh grant; a rotation and a reuse tried in a "
                  "rolled-back savepoint; the token lifetimes")


def check_connected_apps(ctx: Context) -> Check:
    active = (OAuthGrant.revoked_at.is_(None),)
    grants = int(ctx.session.scalar(select(func.count()).select_from(OAuthGrant)
                                    .where(*active)))
    clients = int(ctx.session.scalar(select(func.count(func.distinct(OAuthGrant.client_pk)))
                                     .where(*active)))
    hard = int(ctx.session.scalar(select(func.count()).select_from(OAuthGrant).where(
        *active, _has(OAuthGrant.scopes, HARD_DELETE))))
    by_kind = dict(ctx.session.execute(
        select(OAuthClient.kind, func.count()).group_by(OAuthClient.kind)).all())
    passed = hard == 0
    return _check("access.connected_apps", passed,
                  f"{grants} live connection(s) of {clients} app(s); none may hard delete."
                  if passed else f"{hard} live connection(s) may hard delete.",
                  {"live_connections": grants, "apps": clients,
                   "connections_with_hard_delete": hard,
                   "registered_clients_by_kind": {k: int(v) for k, v in by_kind.items()}},
                  "count of unrevoked OAuth grants and their scopes")


# -- data ---------------------------------------------------------------------------------

def check_db_role(ctx: Context) -> Check:
    role, superuser, bypass, createrole, createdb = ctx.session.execute(text(
        "SELECT rolname, rolsuper, rolbypassrls, rolcreaterole, rolcreatedb FROM pg_roles "
        "WHERE rolname = current_user")).one()
    owns = int(ctx.session.scalar(text(
        "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'public' AND pg_get_userbyid(c.relowner) = current_user")))
    passed = not (superuser or bypass or createrole) and owns == 0
    return _check("data.db_role", passed,
                  "The app connects as a role that is no superuser, cannot bypass row "
                  "security and owns no table." if passed else
                  f"The app's role: superuser {superuser}, BYPASSRLS {bypass}, CREATEROLE "
                  f"{createrole}, owns {owns} relation(s).",
                  {"role": role, "superuser": bool(superuser), "bypassrls": bool(bypass),
                   "createrole": bool(createrole), "createdb": bool(createdb),
                   "owned_relations": owns},
                  "pg_roles and pg_class for current_user, on the app's own connection")


def _refused(session: Session, statement: str) -> bool:
    """Run ``statement`` in a savepoint that is always rolled back: whether the database
    refused it (no privilege, or a guard trigger). Nothing it did survives the rollback."""
    savepoint = session.begin_nested()
    try:
        session.execute(text("SET LOCAL lock_timeout = '2s'"))
        session.execute(text(statement))
    except DBAPIError:
        savepoint.rollback()
        return True
    savepoint.rollback()
    return False


# A column each audit table has, to write back unchanged.
_COLUMNS = {"audit_events": "action", "audit_checkpoints": "hash", "audit_chain": "chain_id"}


def check_audit_append_only(ctx: Context) -> Check:
    session = ctx.session
    present = [t for t in AUDIT_TABLES
               if session.scalar(text("SELECT to_regclass(:t) IS NOT NULL"), {"t": t})]
    privileges, probes, rows = {}, {}, {}
    for table in present:
        privileges[table] = {
            op: bool(session.scalar(text(
                "SELECT has_table_privilege(current_user, :t, :op)"), {"t": table, "op": op}))
            for op in ("UPDATE", "DELETE", "TRUNCATE")}
        # One real row (the oldest), so a guard trigger is really reached.
        one = f"ctid = (SELECT ctid FROM {table} LIMIT 1)"
        column = _COLUMNS[table]
        rows[table] = bool(session.scalar(text(f"SELECT EXISTS (SELECT 1 FROM {table})")))
        probes[table] = {
            "UPDATE": _refused(session, f"UPDATE {table} SET {column} = {column} WHERE {one}"),
            "DELETE": _refused(session, f"DELETE FROM {table} WHERE {one}"),
            "TRUNCATE": _refused(session, f"TRUNCATE {table}"),
        }
    triggers = int(session.scalar(text(
        "SELECT count(*) FROM pg_trigger WHERE NOT tgisinternal AND tgenabled <> 'D' AND "
        "tgrelid = ANY(ARRAY(SELECT to_regclass(t) FROM unnest(CAST(:ts AS text[])) AS t))"),
        {"ts": present}))
    # The log and its checkpoints are revoked from the app outright (the owner could
    # switch the triggers off; the app cannot): a grant there fails the check.
    granted = [f"{op} on {t}" for t, ops in privileges.items() if t in APPEND_ONLY_TABLES
               for op, ok in ops.items() if ok]
    taken = [f"{op} on {t}" for t, ops in probes.items() for op, refused in ops.items()
             if not refused]
    passed = len(present) == len(AUDIT_TABLES) and not granted and not taken
    return _check("data.audit_append_only", passed,
                  "The app's role may not UPDATE, DELETE or TRUNCATE the audit log, and "
                  "each attempt on every audit table was refused." if passed else
                  f"Granted to the app: {', '.join(granted) or 'nothing'}; taken when "
                  f"tried: {', '.join(taken) or 'nothing'}; tables found {len(present)} of "
                  f"{len(AUDIT_TABLES)}.",
                  {"tables": present, "privileges": privileges, "refused": probes,
                   "rows_probed": rows, "guard_triggers_enabled": triggers},
                  "has_table_privilege for the app's role, then each statement tried on a "
                  "real row in a savepoint that is rolled back")


def check_audit_chain(ctx: Context) -> Check:
    anchoring = Anchoring.from_settings(ctx.config)
    try:
        anchors = read_anchors(anchoring, chain=chain_id(ctx.session))
    except OSError:
        anchors = None
    result = verify_chain(ctx.session, anchors=anchors)
    newest = anchors.newest_seq if anchors is not None else None
    newest_matched = newest is not None and result.ok and result.head_seq >= newest
    passed = result.ok and anchors is not None and (newest_matched or result.head_seq == 0)
    if anchors is None:
        summary = "The anchor store could not be read."
    elif not result.ok:
        summary = result.describe().splitlines()[0]
    elif not passed:
        summary = f"The chain links ({result.events} events) but no signed anchor holds it yet."
    else:
        summary = (f"{result.events} events link end to end; the newest signed anchor "
                   f"(seq {newest}) matches.")
    return _check("data.audit_chain", passed, summary,
                  {"events": result.events, "head_seq": result.head_seq,
                   "head_hash": result.head_hash, "checkpoints_matched": result.checkpoints,
                   "anchors": anchors.count if anchors is not None else None,
                   "anchors_matched": result.anchors_matched, "newest_anchor_seq": newest,
                   "broken_at_seq": result.broken_seq},
                  "every event's hash and link recomputed; checkpoints and signed anchors "
                  "(outside the database) checked against the chain")


def check_truth_check(ctx: Context) -> Check:
    run = last_verification(ctx.session)
    interval = int(ctx.config.get("MEMORY_VERIFY_SECONDS") or 0)
    if run is None:
        return _check("data.truth_check", False, "The truth check has never run.",
                      {"last_run": None, "interval_seconds": interval},
                      "the newest memory_verifications row")
    age = (ctx.now - run.finished_at).total_seconds()
    fresh = interval > 0 and age <= 2 * interval
    passed = fresh and run.violations == 0
    return _check("data.truth_check", passed,
                  f"Last run {stamp(run.finished_at)}: {run.users_checked} users, "
                  f"{run.chunks_checked} chunks, no finding." if passed else
                  f"Last run {stamp(run.finished_at)}: {run.violations} finding(s); "
                  f"{'on time' if fresh else 'overdue or switched off'}.",
                  {"last_run": stamp(run.finished_at), "age_seconds": int(age),
                   "interval_seconds": interval, "users_checked": run.users_checked,
                   "chunks_checked": run.chunks_checked, "violations": run.violations,
                   "repairs_requested": run.repairs_requested},
                  "the newest memory_verifications row")


def check_retention(ctx: Context) -> Check:
    plans = ctx.session.execute(select(Plan.slug, Plan.retention, Plan.restore_window_days)
                                .where(Plan.active.is_(True)).order_by(Plan.slug)).all()
    interval = int(ctx.config.get("RETENTION_SECONDS") or 0)
    windows = {slug: {"windows_days": dict(retention or {}), "restore_window_days": restore}
               for slug, retention, restore in plans}
    passed = interval > 0
    return _check("data.retention", passed,
                  f"Retention runs every {interval} s over {len(plans)} plan(s)." if passed
                  else "The retention run is switched off (RETENTION_SECONDS=0).",
                  {"plans": windows, "run_interval_seconds": interval,
                   "build_record_days": ctx.config.get("BUILD_RECORD_DAYS"),
                   "access_log_days": ctx.config.get("ACCESS_LOG_DAYS")},
                  "the active plans' windows; the worker's retention interval")


def check_legal_holds(ctx: Context) -> Check:
    now = ctx.now
    open_ = int(ctx.session.scalar(select(func.count()).select_from(LegalHold).where(
        LegalHold.released_at.is_(None),
        (LegalHold.ends_at.is_(None)) | (LegalHold.ends_at > now))))
    pending = int(ctx.session.scalar(select(func.count()).select_from(ForgetMarker).where(
        ForgetMarker.pending_hold.is_(True), ForgetMarker.completed_by_id.is_(None))))
    # A pending erasure whose owner is under no hold should have completed.
    stranded = int(ctx.session.scalar(text(
        "SELECT count(*) FROM forget_markers m WHERE m.pending_hold AND m.completed_by_id IS "
        "NULL AND NOT EXISTS (SELECT 1 FROM legal_holds h WHERE h.user_id = m.owner_id AND "
        "h.released_at IS NULL AND (h.ends_at IS NULL OR h.ends_at > :now))"), {"now": now}))
    passed = stranded == 0
    return _check("data.legal_holds", passed,
                  f"{open_} open hold(s); {pending} erasure(s) wait for one." if passed else
                  f"{stranded} erasure(s) still wait for a hold that has ended.",
                  {"open_holds": open_, "erasures_pending_hold": pending,
                   "pending_without_hold": stranded},
                  "count of open holds and of erasure receipts waiting for one")


def check_erasure(ctx: Context) -> Check:
    nonzero = int(ctx.session.scalar(select(func.count()).select_from(ForgetMarker).where(
        ForgetMarker.probe_rows > 0)))
    probed = int(ctx.session.scalar(select(func.count()).select_from(ForgetMarker).where(
        ForgetMarker.probe_rows.is_not(None))))
    oldest_waiting = ctx.session.scalar(select(func.min(ForgetMarker.created_at)).where(
        ForgetMarker.vacuum_due.is_(True), ForgetMarker.vacuumed_at.is_(None)))
    lag = int((ctx.now - oldest_waiting).total_seconds()) if oldest_waiting else 0
    interval = int(ctx.config.get("ERASURE_VACUUM_SECONDS") or 0)
    lag_ok = oldest_waiting is None or (interval > 0 and lag <= 3 * interval + 60)
    passed = nonzero == 0 and lag_ok
    return _check("data.erasure", passed,
                  f"{probed} post-delete probe(s), all zero; VACUUM lag {lag} s." if passed
                  else f"{nonzero} probe(s) found rows left; VACUUM lag {lag} s "
                  f"(interval {interval} s).",
                  {"probes": probed, "probes_nonzero": nonzero, "vacuum_lag_seconds": lag,
                   "vacuum_interval_seconds": interval},
                  "erasure receipts' post-delete probes; the oldest receipt waiting for a "
                  "VACUUM")


def check_backups(ctx: Context, *, embedded: bool) -> Check:
    days = ctx.config.get("BACKUP_RETENTION_DAYS")
    stated = days is not None or embedded
    return _check("data.backups", stated,
                  (f"Backups keep copies {days} days: erased content is gone from them by "
                   "then." if days is not None else "The embedded database keeps no "
                   "backups.") if stated else
                  "The backup horizon is not stated (BACKUP_RETENTION_DAYS unset on an "
                  "external database).",
                  {"backup_retention_days": days, "embedded_database": embedded},
                  "the stated backup horizon erasure receipts quote")


def _drill_dict(drill: EvidenceDrill | None) -> dict[str, Any] | None:
    if drill is None:
        return None
    return {"id": drill.id, "status": drill.status, "ok": drill.ok,
            "started_at": stamp(drill.created_at),
            "finished_at": stamp(drill.finished_at) if drill.finished_at else None,
            "steps": drill.steps}


def last_drill(session: Session, team_id: int | None) -> EvidenceDrill | None:
    query = select(EvidenceDrill).where(EvidenceDrill.status.in_(("ready", "failed")))
    query = query.where(EvidenceDrill.team_id.is_(None) if team_id is None
                        else EvidenceDrill.team_id == team_id)
    return session.scalars(query.order_by(EvidenceDrill.id.desc()).limit(1)).first()


def _drill_check(ctx: Context, check_id: str, drill: EvidenceDrill | None) -> Check:
    fresh = drill is not None and drill.finished_at is not None and \
        ctx.now - drill.finished_at <= DRILL_MAX_AGE
    passed = bool(drill is not None and drill.ok and fresh)
    if drill is None:
        summary = "No drill has run yet."
    elif not drill.ok:
        failed = [s["step"] for s in drill.steps if not s.get("ok")]
        summary = f"The last drill failed at: {', '.join(failed) or drill.status}."
    elif not fresh:
        summary = "The last drill is older than 90 days."
    else:
        summary = ("The last drill saved, recalled, hard-deleted, probed, vacuumed and "
                   "exported: the memory was gone.")
    return _check(check_id, passed, summary, {"drill": _drill_dict(drill)},
                  "the newest finished drill's receipts")


def check_drill(ctx: Context) -> Check:
    return _drill_check(ctx, "data.drill", last_drill(ctx.session, None))


# -- application ----------------------------------------------------------------------------

def check_headers(ctx: Context) -> Check:
    headers = ctx.probes.headers
    missing = [name for name in REQUIRED_HEADERS if not headers.get(name)]
    csp = headers.get("Content-Security-Policy", "")
    weak_csp = [part for part in ("default-src", "frame-ancestors", "object-src")
                if part not in csp] + (["'unsafe-inline' scripts"]
                                       if re.search(r"script-src[^;]*'unsafe-inline'", csp)
                                       else [])
    passed = not missing and not weak_csp and \
        headers.get("X-Content-Type-Options", "").lower() == "nosniff"
    return _check("app.headers", passed,
                  "Every security header is sent, with a strict CSP." if passed else
                  f"Missing: {', '.join(missing) or 'none'}; CSP lacks: "
                  f"{', '.join(weak_csp) or 'nothing'}.",
                  {"headers": {name: headers.get(name) for name in
                               (*REQUIRED_HEADERS, "Cross-Origin-Opener-Policy",
                                "Permissions-Policy")},
                   "missing": missing},
                  "an internal GET of the sign-in page")


def check_csrf(ctx: Context) -> Check:
    status = ctx.probes.csrf_status
    return _check("app.csrf", status == 400,
                  "A form POST without its CSRF token is refused (400)." if status == 400
                  else f"A form POST without its CSRF token got {status}.",
                  {"post_without_token_status": status},
                  "an internal POST to the sign-out form without a token")


def check_only_post(ctx: Context) -> Check:
    rules = ctx.probes.mutating_rules
    return _check("app.only_post_mutates", not rules,
                  "Outside the key-authenticated API, no route takes PUT, PATCH or DELETE."
                  if not rules else f"Routes taking PUT/PATCH/DELETE: {', '.join(rules)}.",
                  {"mutating_routes_outside_api": rules},
                  "every rule of the app's URL map")


def check_limits(ctx: Context) -> Check:
    probes = ctx.probes
    api = probes.limits.get("api")
    passed = probes.oversize_status == 413 and probes.max_content_length is not None and \
        bool(api)
    return _check("app.limits", passed,
                  f"Bodies over {probes.max_content_length} bytes are refused (413); the API "
                  f"is limited to {api}." if passed else
                  f"Oversized body answered {probes.oversize_status}; API limit: {api}.",
                  {"max_content_length": probes.max_content_length,
                   "oversize_status": probes.oversize_status, "limits": probes.limits},
                  "an internal POST declaring a body one byte too large; the limiter")


# -- software -------------------------------------------------------------------------------

def check_versions(ctx: Context, *, app_version: str, commit: str | None) -> Check:
    postgres = ctx.session.scalar(text("SHOW server_version"))
    server_num = int(ctx.session.scalar(text("SELECT current_setting('server_version_num')")))
    vector = ctx.session.scalar(text(
        "SELECT extversion FROM pg_extension WHERE extname = 'vector'"))
    passed = server_num >= MIN_POSTGRES * 10000 and vector is not None
    return _check("software.versions", passed,
                  f"OrbitPilot {app_version}, Python {platform.python_version()}, "
                  f"PostgreSQL {postgres}, pgvector {vector}." if passed else
                  f"PostgreSQL {postgres} (needs {MIN_POSTGRES}+), pgvector {vector}.",
                  {"app_version": app_version, "commit": commit,
                   "python": platform.python_version(), "postgresql": postgres,
                   "pgvector": vector},
                  "importlib.metadata, the interpreter, SHOW server_version, pg_extension")


def check_sbom(ctx: Context, sbom: dict[str, Any] | None) -> Check:
    components = len((sbom or {}).get("components", []))
    passed = sbom is not None and sbom.get("bomFormat") == "CycloneDX" and components > 0
    return _check("software.sbom", passed,
                  f"CycloneDX {sbom.get('specVersion')} SBOM of {components} distributions."
                  if passed else "No SBOM could be built.",
                  {"components": components,
                   "spec_version": (sbom or {}).get("specVersion")},
                  "cyclonedx-python-lib over importlib.metadata's distributions")


# -- a team ---------------------------------------------------------------------------------

def team_members(session: Session, team_id: int) -> list[dict[str, Any]]:
    rows = session.execute(
        select(TeamMember.user_id, User.display_name, TeamMember.role, TeamMember.joined_at)
        .join(User, User.id == TeamMember.user_id).where(TeamMember.team_id == team_id)
        .order_by(TeamMember.joined_at, TeamMember.user_id)).all()
    return [{"user_id": uid, "name": name, "role": role, "joined_at": stamp(joined)}
            for uid, name, role, joined in rows]


def check_team_members(ctx: Context, team: Team) -> Check:
    members = team_members(ctx.session, team.id)
    roles: dict[str, int] = {}
    for member in members:
        roles[member["role"]] = roles.get(member["role"], 0) + 1
    passed = roles.get("owner", 0) >= 1
    return _check("team.members", passed,
                  f"{len(members)} member(s): " + ", ".join(
                      f"{n} {role}" for role, n in sorted(roles.items())) + "." if passed
                  else "The team has no owner.",
                  {"members": members, "by_role": roles},
                  "the team's membership rows")


def team_policies(team: Team) -> dict[str, Any]:
    return {"write": team.write_policy, "forget": team.forget_policy, "apps": team.app_policy,
            "max_key_days": team.max_key_days, "leavers": team.leaver_policy}


def check_team_policies(ctx: Context, team: Team) -> Check:
    policies = team_policies(team)
    # Keys that can act for the team but outlive its key lifetime are refused at every
    # call (access.reach_of); live hard-delete keys without expiry are counted here.
    keys = int(ctx.session.scalar(select(func.count()).select_from(ApiKey).where(
        ApiKey.revoked_at.is_(None), _has(ApiKey.team_ids, team.id),
        ApiKey.expires_at.is_(None), _has(ApiKey.scopes, HARD_DELETE))))
    passed = keys == 0
    return _check("team.policies", passed,
                  "Writes: {write}; forgets: {forget}; apps: {apps}; key lifetime: "
                  "{days}; leavers: {leavers}.".format(
                      days=f"{team.max_key_days} days" if team.max_key_days else "no limit",
                      **policies) if passed else
                  f"{keys} live key(s) naming the team can hard delete and never expire.",
                  {"policies": policies, "hard_delete_keys_without_expiry": keys},
                  "the team's policy row; the keys that name it")


def check_team_apps(ctx: Context, team: Team) -> Check:
    allowed = ctx.session.execute(
        select(OAuthClient.client_id, OAuthClient.kind, TeamApp.approved_at)
        .join(TeamApp, TeamApp.client_pk == OAuthClient.id)
        .where(TeamApp.team_id == team.id).order_by(TeamApp.approved_at)).all()
    grants = int(ctx.session.scalar(select(func.count()).select_from(OAuthGrant).where(
        OAuthGrant.revoked_at.is_(None), _has(OAuthGrant.team_ids, team.id))))
    listed = team.app_policy in ("allow_list", "approve")
    passed = listed or grants == 0
    return _check("team.apps", passed,
                  f"App policy {team.app_policy}: {len(allowed)} app(s) on the list, "
                  f"{grants} live connection(s) act for the team." if passed else
                  f"Any app may act for the team, and {grants} connection(s) do.",
                  {"app_policy": team.app_policy,
                   "allowed": [{"client_id": cid, "kind": kind, "approved_at": stamp(at)}
                               for cid, kind, at in allowed],
                   "live_connections": grants},
                  "the team's app list; unrevoked connections naming the team")


def check_team_location(ctx: Context, team: Team, *, where: dict[str, Any]) -> Check:
    plan = ctx.session.scalar(select(Plan.slug).join(User, User.plan_id == Plan.id)
                              .where(User.id == team.id))
    chunks = int(ctx.session.scalar(text(
        "SELECT count(*) FROM memory_chunks WHERE user_id = :id"), {"id": team.id}))
    passed = bool(where.get("database"))
    return _check("team.data_location", passed,
                  f"In the database {where.get('database')} on {where.get('host')}; "
                  f"plan {plan or 'default'}; {chunks} memory chunk(s)." if passed
                  else "Where the team's data lives could not be read.",
                  {**where, "plan": plan or "default", "memory_chunks": chunks},
                  "current_database(), the server's address; the team account's plan")


def check_team_drill(ctx: Context, team: Team) -> Check:
    return _drill_check(ctx, "team.drill", last_drill(ctx.session, team.id))


def database_location(session: Session, *, embedded: bool) -> dict[str, Any]:
    name, host = session.execute(text(
        "SELECT current_database(), coalesce(host(inet_server_addr()), 'local socket')")).one()
    return {"database": name, "host": host, "embedded": embedded}
