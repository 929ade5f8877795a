"""``flask evidence report`` (measure, sign and write the report's files) and ``flask
evidence verify FILE`` (check a report's detached Ed25519 signature, offline)."""

from __future__ import annotations

from pathlib import Path

import click
from flask import current_app
from flask.cli import with_appcontext

from dashboard.audit.services import CLI_ACTOR
from dashboard.evidence.drill import request_drill, run_drill
from dashboard.evidence.report import make_report, rendering, request_report
from dashboard.evidence.signing import key_id, load_public_pem, verify
from dashboard.evidence.web import inputs_for, signing_key
from dashboard.extensions import db
from dashboard.memory import settings_from
from dashboard.teams.models import Team


@click.group("evidence", help="Evidence for evaluators: the signed report, its check.")
def evidence_group() -> None:
    pass


def _team(slug: str | None) -> Team | None:
    if slug is None:
        return None
    team = db.session.query(Team).filter_by(slug=slug).first()
    if team is None:
        raise click.ClickException(f"No team has the slug {slug!r}.")
    return team


@evidence_group.command("drill")
@click.option("--team", "slug", default=None, help="a team's drill (its slug)")
@with_appcontext
def evidence_drill(slug: str | None) -> None:
    """Run the deletion/export drill on the sandbox account now and print each step's
    result; the next report carries its receipts. Exit status 1 when a step failed."""
    drill, _ = request_drill(db.session, None, team=_team(slug), actor=CLI_ACTOR,
                             defer=False)
    db.session.commit()
    drill = run_drill(db.session, drill.id, engine=db.engine,
                      settings=settings_from(current_app.config), commit=db.session.commit)
    for step in drill.steps:
        click.echo(f"  {step['step']}: {'ok' if step['ok'] else 'FAILED'}")
    click.echo(f"Drill {drill.id}: {'passed' if drill.ok else 'failed'}.")
    if not drill.ok:
        raise SystemExit(1)


@evidence_group.command("report")
@click.option("--team", "slug", default=None, help="a team's part (its slug) instead of "
              "the deployment's")
@click.option("--out", "out_dir", default=".", show_default=True,
              type=click.Path(file_okay=False, path_type=Path),
              help="folder the files are written to")
@with_appcontext
def evidence_report(slug: str | None, out_dir: Path) -> None:
    """Measure every check now, sign the report and write report.json with its .sig, the
    OSCAL assessment results with theirs, the HTML page and the public key. Exit status
    1 when a check failed."""
    report, _ = request_report(db.session, None, team=_team(slug), actor=CLI_ACTOR,
                               defer=False)
    db.session.commit()
    app = current_app._get_current_object()
    report = make_report(db.session, report.id, inputs_for(app), commit=db.session.commit)
    key = signing_key(app)
    out_dir.mkdir(parents=True, exist_ok=True)
    names = {"json": "report.json", "json.sig": "report.json.sig",
             "oscal.json": "report.oscal.json", "oscal.json.sig": "report.oscal.json.sig",
             "html": "report.html"}
    for fmt, name in names.items():
        (out_dir / name).write_bytes(rendering(report, fmt, key))
    (out_dir / "evidence-key.pem").write_text(key.public_pem())
    click.echo(f"Report {report.id}: {report.passed} passed, {report.failed} failed; "
               f"written to {out_dir}/ (signed by key {key.key_id()}).")
    if report.failed:
        raise SystemExit(1)


@evidence_group.command("verify")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--signature", "sig_path", default=None,
              type=click.Path(dir_okay=False, path_type=Path),
              help="the detached signature (default: FILE.sig)")
@click.option("--key", "key_path", default=None,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="the public key, PEM (default: this deployment's)")
@with_appcontext
def evidence_verify(file: Path, sig_path: Path | None, key_path: Path | None) -> None:
    """Check FILE's Ed25519 signature: OK, or FAILED and exit status 1."""
    sig_path = sig_path or file.with_name(file.name + ".sig")
    if not sig_path.exists():
        raise click.ClickException(f"No signature at {sig_path}.")
    try:
        public = load_public_pem(key_path.read_bytes()) if key_path is not None \
            else signing_key(current_app).public
    except ValueError as exc:
        raise click.ClickException(f"The key cannot be read: {exc}.") from None
    if verify(public, file.read_bytes(), sig_path.read_bytes()):
        click.echo(f"OK: {file.name} is signed by key {key_id(public)}.")
        return
    click.echo(f"FAILED: {file.name} does not match its signature under key "
               f"{key_id(public)} (changed, or signed by another key).")
    raise SystemExit(1)
