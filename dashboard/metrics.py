"""``GET /metrics``: Prometheus text for the operators — the truth check's last run, the
build queue (as PostgreSQL holds it, the source of truth, and as RQ holds it) and build
outcomes. Counts only. For staff signed in, or a scraper with ``METRICS_TOKEN`` as a
bearer token; anyone else gets 401 (403 when signed in without a staff role)."""

from __future__ import annotations

import hmac
import logging
from collections.abc import Iterable

from flask import Blueprint, Response, current_app, request
from flask_login import current_user
from sqlalchemy import func, select

from dashboard.extensions import db
from dashboard.memory import BUILD_STATUSES, MemoryBuild, last_verification
from dashboard.queues import build_queue

log = logging.getLogger(__name__)
bp = Blueprint("metrics", __name__)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _token_ok() -> bool:
    expected = current_app.config.get("METRICS_TOKEN") or ""
    header = request.headers.get("Authorization", "")
    scheme, _, given = header.partition(" ")
    return bool(expected) and scheme.lower() == "bearer" and \
        hmac.compare_digest(given.strip().encode(), expected.encode())


def _problem(status: int, detail: str) -> Response:
    response = Response(f"{detail}\n", status=status, content_type="text/plain; charset=utf-8")
    if status == 401:
        response.headers["WWW-Authenticate"] = 'Bearer realm="metrics"'
    return response


def _family(name: str, kind: str, help_: str, samples: Iterable[tuple[str, float]]) -> list[str]:
    lines = [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
    lines += [f"{name}{labels} {_number(value)}" for labels, value in samples]
    return lines


def _number(value: float) -> str:
    # Every digit: a timestamp in %g would be off by an hour.
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def render_metrics() -> str:
    session = db.session
    by_status = dict(session.execute(
        select(MemoryBuild.status, func.count()).group_by(MemoryBuild.status)).all())
    lines = _family("orbitpilot_builds", "gauge", "Build records by status.",
                    [(f'{{status="{s}"}}', by_status.get(s, 0)) for s in BUILD_STATUSES])
    try:
        rq_depth: float | None = build_queue(current_app).rq().count
    except Exception as exc:  # Redis down: the database's figures still stand
        log.warning("metrics: the build queue cannot be read (%s)", type(exc).__name__)
        rq_depth = None
    lines += _family("orbitpilot_build_queue_up", "gauge",
                     "1 when the RQ build queue could be read.",
                     [("", 0 if rq_depth is None else 1)])
    if rq_depth is not None:
        lines += _family("orbitpilot_build_queue_jobs", "gauge",
                         "Jobs waiting in the RQ build queue.", [("", rq_depth)])
    run = last_verification(session)
    if run is not None:
        figures = {
            "last_run_timestamp_seconds": ("When the last run finished (Unix time).",
                                           run.finished_at.timestamp()),
            "users_checked": ("Users the last run judged.", run.users_checked),
            "users_pending": ("Users the last run left to a build that was due.",
                              run.users_pending),
            "chunks_checked": ("Chunks the last run looked at.", run.chunks_checked),
            "violations": ("Findings of the last run.", run.violations),
            "users_with_violations": ("Users with a finding in the last run.",
                                      run.users_with_violations),
            "repairs_requested": ("Repair builds the last run asked for.",
                                  run.repairs_requested),
        }
        for name, (help_, value) in figures.items():
            lines += _family(f"orbitpilot_truth_check_{name}", "gauge", help_, [("", value)])
    return "\n".join(lines) + "\n"


@bp.route("/metrics")
def metrics() -> Response:
    if not _token_ok():
        if not current_user.is_authenticated:
            return _problem(401, "Sign in as staff, or send the metrics token as a bearer "
                                 "token.")
        if not current_user.is_staff:
            return _problem(403, "The metrics are for staff.")
    return Response(render_metrics(), content_type=CONTENT_TYPE)
