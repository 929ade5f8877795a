"""The evidence report: asked for (a row and a job), measured (``checks``), signed
(canonical JSON, Ed25519), read and downloaded (audited, content-free). A team's report
holds the team's own checks and the deployment's non-secret ones (``controls.team``)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from dashboard.audit.services import Actor, record_event
from dashboard.evidence import checks as c
from dashboard.evidence.controls import AREAS, BY_ID
from dashboard.evidence.formats import KEY_PATH, oscal_assessment_results, report_html
from dashboard.evidence.models import EvidenceReport
from dashboard.evidence.sbom import app_version, build_sbom
from dashboard.evidence.signing import SigningKey, canonical_bytes
from dashboard.memory import Call, defer_job
from dashboard.refusals import NotFound
from dashboard.teams.models import Team

FORMAT = "orbitpilot-evidence-report"
FORMAT_VERSION = 1
ABANDONED_AFTER = timedelta(minutes=30)
# Names the advisory lock that lets one report per scope be in the making.
_REQUEST_LOCK = 0x0E71DE
DOWNLOADS = {
    "json": ("application/json", "report.json"),
    "json.sig": ("application/octet-stream", "report.json.sig"),
    "oscal.json": ("application/json", "report.oscal.json"),
    "oscal.json.sig": ("application/octet-stream", "report.oscal.json.sig"),
    "html": ("text/html; charset=utf-8", "report.html"),
}


def abandoned(created_at: datetime, now: datetime | None = None) -> bool:
    """A report or drill still "in the making" this long after it was asked for has lost
    its job (each takes seconds): asking again starts a new one."""
    return (now or datetime.now(UTC)) - created_at > ABANDONED_AFTER


class ReportNotFound(NotFound):
    """No such report in this scope (or not ready)."""


@dataclass(frozen=True)
class Inputs:
    """What a report is measured with besides the database: the app's settings, its
    answers to the probes, the signing key, and facts of the process."""

    config: Mapping[str, Any]
    probes: c.AppProbes
    key: SigningKey
    embedded: bool
    commit: str | None


Progress = Callable[[int, str], None]


def _measure(session: Session, inputs: Inputs, team: Team | None,
             progress: Progress) -> tuple[list[c.Check], dict[str, Any]]:
    ctx = c.Context(session, inputs.config, inputs.probes)
    sbom = build_sbom()
    steps: list[tuple[str, list[Callable[[], c.Check]]]] = [
        ("access", [lambda: c.check_passwords(ctx), lambda: c.check_signin_throttle(ctx),
                    lambda: c.check_session_cookies(ctx), lambda: c.check_staff(ctx),
                    lambda: c.check_api_keys(ctx), lambda: c.check_oauth_pkce(ctx),
                    lambda: c.check_oauth_redirects(ctx), lambda: c.check_oauth_tokens(ctx),
                    lambda: c.check_connected_apps(ctx)]),
        ("data", [lambda: c.check_db_role(ctx), lambda: c.check_audit_append_only(ctx),
                  lambda: c.check_audit_chain(ctx), lambda: c.check_truth_check(ctx),
                  lambda: c.check_retention(ctx), lambda: c.check_legal_holds(ctx),
                  lambda: c.check_erasure(ctx),
                  lambda: c.check_backups(ctx, embedded=inputs.embedded),
                  lambda: c.check_drill(ctx)]),
        ("application", [lambda: c.check_headers(ctx), lambda: c.check_csrf(ctx),
                         lambda: c.check_only_post(ctx), lambda: c.check_limits(ctx)]),
        ("software", [lambda: c.check_versions(ctx, app_version=app_version(),
                                               commit=inputs.commit),
                      lambda: c.check_sbom(ctx, sbom)]),
    ]
    if team is not None:
        where = c.database_location(session, embedded=inputs.embedded)
        steps.append(("team", [lambda: c.check_team_members(ctx, team),
                               lambda: c.check_team_policies(ctx, team),
                               lambda: c.check_team_apps(ctx, team),
                               lambda: c.check_team_location(ctx, team, where=where),
                               lambda: c.check_team_drill(ctx, team)]))
    found: list[c.Check] = []
    for number, (area, measures) in enumerate(steps):
        progress(10 + 80 * number // len(steps), f"measuring {area}")
        for measure in measures:
            found.append(measure())
    if team is not None:
        # A team owner sees the team's part and the deployment's non-secret checks only.
        found = [check for check in found if BY_ID[check.id].team]
    return found, sbom


def build_document(session: Session, inputs: Inputs, *, report_id: int,
                   team: Team | None = None, progress: Progress | None = None
                   ) -> dict[str, Any]:
    """Measure every check now and assemble the report (not yet signed)."""
    found, sbom = _measure(session, inputs, team, progress or (lambda percent, stage: None))
    rows = [check.as_dict() for check in found]
    passed = sum(1 for row in rows if row["passed"])
    by_area = {area: {"passed": sum(1 for r in rows if r["area"] == area and r["passed"]),
                      "failed": sum(1 for r in rows if r["area"] == area and not r["passed"])}
               for area in AREAS if any(r["area"] == area for r in rows)}
    document: dict[str, Any] = {
        "format": FORMAT, "format_version": FORMAT_VERSION,
        "id": report_id, "uuid": str(uuid.uuid4()),
        "generated_at": c.stamp(), "scope": "team" if team is not None else "deployment",
        "team": None,
        "deployment": {"app_version": app_version(), "commit": inputs.commit,
                       "public_url": inputs.config.get("PUBLIC_URL")},
        "signing": {"algorithm": "Ed25519", "key_id": inputs.key.key_id(),
                    "public_key_pem": inputs.key.public_pem(), "public_key_path": KEY_PATH},
        "summary": {"total": len(rows), "passed": passed, "failed": len(rows) - passed,
                    "by_area": by_area},
        "checks": rows,
        "sbom": sbom,
    }
    if team is not None:
        document["team"] = {"id": team.id, "slug": team.slug, "name": team.name,
                            "members": c.team_members(session, team.id),
                            "policies": c.team_policies(team)}
    return document


# -- asking, making ---------------------------------------------------------------------------

def report_job_id(report_id: int) -> str:
    return f"evidence-report-{report_id}"


def request_report(session: Session, user: Any, *, team: Team | None = None,
                   actor: Actor | None = None, defer: bool = True
                   ) -> tuple[EvidenceReport, bool]:
    """A new report of the deployment (``team`` None) or of a team, or the one already in
    the making for it (a second click joins it). Audited; its job runs after the commit
    (``defer=False``: the caller makes it, as the CLI does)."""
    session.execute(text("SELECT pg_advisory_xact_lock(:a, :b)"),
                    {"a": _REQUEST_LOCK, "b": team.id if team is not None else 0})
    pending = session.scalars(select(EvidenceReport).where(
        _in_scope(team.id if team is not None else None),
        EvidenceReport.status.in_(("queued", "running")))
        .execution_options(populate_existing=True).limit(1)).first()
    if pending is not None and not abandoned(pending.created_at):
        return pending, False
    if pending is not None:  # its job died (a worker lost): no longer in the making
        pending.status, pending.stage = "failed", "abandoned"
        pending.finished_at = datetime.now(UTC)
    report = EvidenceReport(team_id=team.id if team is not None else None,
                            requested_by_id=user.id if user is not None else None,
                            status="queued", progress=0, stage="queued")
    session.add(report)
    session.flush()
    record_event(session, action="evidence.request", actor=actor or Actor.of(user),
                 owner_id=team.id if team is not None else None, target_type="evidence_report",
                 target_id=report.id, details={"scope": "team" if team else "deployment"})
    if defer:
        defer_job(session, ("call", Call("jobs.evidence.run_report", (report.id,),
                                         report_job_id(report.id),
                                         f"evidence report {report.id}")))
    return report, True


def _in_scope(team_id: int | None) -> Any:
    return EvidenceReport.team_id.is_(None) if team_id is None \
        else EvidenceReport.team_id == team_id


def make_report(session: Session, report_id: int, inputs: Inputs, *,
                commit: Callable[[], None]) -> EvidenceReport | None:
    """Measure, sign and store the report, committing progress between areas (``commit``:
    the job's). A report no longer queued or running is left as it is."""
    report = session.get(EvidenceReport, report_id)
    if report is None or report.status not in ("queued", "running"):
        return report
    team = session.get(Team, report.team_id) if report.team_id is not None else None

    def progress(percent: int, stage: str) -> None:
        report.status, report.progress, report.stage = "running", percent, stage
        commit()

    progress(5, "starting")
    try:
        document = build_document(session, inputs, report_id=report.id, team=team,
                                  progress=progress)
    except Exception:
        session.rollback()
        report = session.get(EvidenceReport, report_id)
        report.status, report.stage, report.finished_at = "failed", "failed", datetime.now(UTC)
        commit()
        raise
    body = canonical_bytes(document)
    report.body, report.signature = body, inputs.key.sign(body)
    report.passed, report.failed = document["summary"]["passed"], document["summary"]["failed"]
    report.status, report.progress, report.stage = "ready", 100, "ready"
    report.finished_at = datetime.now(UTC)
    record_event(session, action="evidence.ready", actor=Actor("system"),
                 owner_id=report.team_id, target_type="evidence_report", target_id=report.id,
                 details={"passed": report.passed, "failed": report.failed,
                          "bytes": len(body)})
    commit()
    return report


# -- reading, downloading ---------------------------------------------------------------------

def reports_of(session: Session, team_id: int | None, *, limit: int = 10
               ) -> list[EvidenceReport]:
    return list(session.scalars(select(EvidenceReport).where(_in_scope(team_id))
                                .order_by(EvidenceReport.id.desc()).limit(limit)))


def find_report(session: Session, report_id: Any, *, team_id: int | None) -> EvidenceReport:
    """The scope's report; another scope's, or none: ``ReportNotFound`` alike."""
    try:
        number = int(report_id)
    except (TypeError, ValueError):
        raise ReportNotFound("There is no such report.") from None
    if not 0 < number < 2 ** 63:
        raise ReportNotFound("There is no such report.")
    report = session.scalars(select(EvidenceReport).where(
        EvidenceReport.id == number, _in_scope(team_id))).first()
    if report is None:
        raise ReportNotFound("There is no such report.")
    return report


def document_of(report: EvidenceReport) -> dict[str, Any]:
    import json

    return json.loads(report.body or b"null")


def rendering(report: EvidenceReport, fmt: str, key: SigningKey) -> bytes:
    """The bytes of one download: the signed JSON or its signature, the OSCAL form (and
    its own signature: Ed25519 is deterministic, so it is the same each time), the page."""
    body = report.body or b""
    if fmt == "json":
        return body
    if fmt == "json.sig":
        return report.signature or b""
    document = document_of(report)
    if fmt in ("oscal.json", "oscal.json.sig"):
        oscal = canonical_bytes(oscal_assessment_results(document))
        return oscal if fmt == "oscal.json" else key.sign(oscal)
    if fmt == "html":
        return report_html(document, key_id=document["signing"]["key_id"]).encode("utf-8")
    raise ReportNotFound("There is no such download.")


def open_download(session: Session, user: Any, report_id: Any, fmt: str, *,
                  team_id: int | None, key: SigningKey) -> tuple[bytes, str, str]:
    """A ready report's bytes in ``fmt``, audited as downloaded (format and size only);
    the caller commits. Returns (bytes, media type, file name)."""
    if fmt not in DOWNLOADS:
        raise ReportNotFound("There is no such download.")
    report = find_report(session, report_id, team_id=team_id)
    if report.status != "ready":
        raise ReportNotFound("This report is not ready yet.")
    data = rendering(report, fmt, key)
    record_event(session, action="evidence.download", actor=Actor.of(user),
                 owner_id=team_id, target_type="evidence_report", target_id=report.id,
                 details={"format": fmt, "bytes": len(data)})
    media, name = DOWNLOADS[fmt]
    return data, media, f"orbitpilot-evidence-{report.id}-{name}"
