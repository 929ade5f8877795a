"""Flask CLI commands: embedded services, accounts, demo data, the audit log, erasure
upkeep. The worker and the build commands are ``jobs.cli``'s."""

from __future__ import annotations

import json

import click
from flask import Flask, current_app
from flask.cli import with_appcontext

from dashboard.audit.anchors import Anchoring, read_anchors
from dashboard.audit.services import (
    CLI_ACTOR,
    anchor_head,
    chain_id,
    checkpoint_chain,
    record_event,
    verify_chain,
)
from dashboard.auth import services as accounts
from dashboard.connectors.cli import mcp_group
from dashboard.demo import DEMO_PASSWORD, describe_seeded, seed_demo
from dashboard.embedded import get_services
from dashboard.evidence.cli import evidence_group
from dashboard.extensions import db
from dashboard.memory import VIOLATION_KINDS, settings_from, verify_memory
from dashboard.plans.services import find_plan
from dashboard.refusals import Refusal
from dashboard.saved_memories.erasure import vacuum_after_erasures


def register_cli(app: Flask) -> None:
    app.cli.add_command(services_group)
    app.cli.add_command(mcp_group)
    app.cli.add_command(create_admin)
    app.cli.add_command(create_user_command)
    app.cli.add_command(set_role_command)
    app.cli.add_command(seed_demo_command)
    app.cli.add_command(audit_group)
    app.cli.add_command(memories_group)
    app.cli.add_command(evidence_group)


@click.group("services", help="The embedded PostgreSQL and Valkey servers.")
def services_group() -> None:
    pass


@services_group.command("status")
@with_appcontext
def services_status() -> None:
    """Whether they answer, and which processes hold them (starts nothing)."""
    click.echo(json.dumps(_embedded().status(), indent=2))


@services_group.command("stop")
@click.option("--if-unused", is_flag=True, help="only when no other live process holds them")
@click.option("--force", is_flag=True, help="even while other processes hold them")
@with_appcontext
def services_stop(if_unused: bool, force: bool) -> None:
    """Stop both embedded servers (starts nothing)."""
    holders = _embedded().stop(force=force)
    if holders:
        message = (f"Still in use by processes {', '.join(map(str, holders))}; "
                   "left running (--force stops them anyway).")
        if if_unused:
            click.echo(message)
            return
        raise click.ClickException(message)
    click.echo("Embedded PostgreSQL and Valkey stopped.")


def _embedded():
    return get_services(current_app.config["EMBEDDED_DIR"])


def _fail(message: str) -> None:
    raise click.ClickException(message)


def _create(email: str, password: str, name: str, role: str, plan_ref: str | None) -> None:
    try:
        plan = find_plan(db.session, plan_ref) if plan_ref else None
        user = accounts.create_user(
            db.session, email=email, password=password, display_name=name, role=role,
            plan=plan, min_password_length=current_app.config["PASSWORD_MIN_LENGTH"],
        )
    except Refusal as exc:  # an unknown plan, or the account refused
        _fail(exc.sentence)
    record_event(db.session, action="user.create", actor=CLI_ACTOR, owner_id=user.id,
                 target_type="user", target_id=user.id,
                 details={"after": {"role": user.role, "plan_id": user.plan_id}})
    db.session.commit()
    click.echo(f"Created {user.role} {user.email} (id {user.id}).")


@click.command("create-admin")
@click.option("--email", prompt=True)
@click.option("--password", prompt=True, hide_input=True, confirmation_prompt=True)
@click.option("--name", default="")
@with_appcontext
def create_admin(email: str, password: str, name: str) -> None:
    """Create an administrator account."""
    _create(email, password, name, "admin", None)


@click.command("create-user")
@click.option("--email", prompt=True)
@click.option("--password", prompt=True, hide_input=True, confirmation_prompt=True)
@click.option("--name", default="")
@click.option("--role", default="user", show_default=True, help="user, support or admin")
@click.option("--plan", "plan_ref", default=None, help="plan slug or name (default: Free)")
@with_appcontext
def create_user_command(email: str, password: str, name: str, role: str,
                        plan_ref: str | None) -> None:
    """Create an account with a role and a plan."""
    _create(email, password, name, role, plan_ref)


@click.command("set-role")
@click.argument("email")
@click.argument("role")
@with_appcontext
def set_role_command(email: str, role: str) -> None:
    """Change an account's role."""
    user = accounts.get_user_by_email(db.session, email)
    if user is None:
        _fail(f"No account with email {email!r}.")
    try:
        change = accounts.set_role(db.session, user, role, actor=CLI_ACTOR)
    except accounts.AccountError as exc:
        _fail(exc.sentence)
    db.session.commit()
    click.echo(f"{user.email}: {change.before} -> {change.after}")


@click.command("seed-demo")
@click.option("--password", default=None, help="password for every demo account")
@with_appcontext
def seed_demo_command(password: str | None) -> None:
    """Demo plans (Free, Plus, Team), users on each, support and admin accounts."""
    password = password or DEMO_PASSWORD
    seeded = seed_demo(db.session, password)
    db.session.commit()
    for line in describe_seeded(seeded, password):
        click.echo(line)


@click.group("audit", help="The append-only, hash-chained audit log.")
def audit_group() -> None:
    pass


def _anchoring() -> Anchoring:
    try:
        return Anchoring.from_settings(current_app.config)
    except ValueError as exc:
        _fail(str(exc))


@audit_group.command("verify")
@click.option("--expect", "expected", multiple=True, metavar="SEQ:HASH",
              help="a chain head kept elsewhere (from an earlier verify) that this log "
                   "must still contain; repeatable")
@with_appcontext
def audit_verify(expected: tuple[str, ...]) -> None:
    """Recompute the hash chain and check it against the checkpoints and the signed
    anchors; print OK or what is broken (exit status 1)."""
    heads = {}
    for item in expected:
        seq, _, head_hash = item.partition(":")
        if not (seq.isdigit() and len(head_hash) == 64
                and all(c in "0123456789abcdef" for c in head_hash)):
            _fail(f"--expect takes SEQ:HASH (a number, a colon, 64 hex digits), not {item!r}.")
        heads[int(seq)] = head_hash
    anchoring = _anchoring()
    try:
        anchors = read_anchors(anchoring, chain=chain_id(db.session))
    except OSError as exc:
        _fail(f"Cannot read the anchors in {anchoring.store.where}: {exc.strerror}.")
    result = verify_chain(db.session, expect=heads, anchors=anchors)
    db.session.rollback()
    click.echo(result.describe())
    if not result.ok:
        raise SystemExit(1)


@audit_group.command("checkpoint")
@with_appcontext
def audit_checkpoint() -> None:
    """Write the chain head down, and a signed anchor of it outside the database (the
    worker also does this periodically)."""
    anchoring = _anchoring()
    checkpoint = checkpoint_chain(db.session)
    db.session.commit()  # the row stands even if the anchor store fails
    if checkpoint is not None:
        click.echo(f"Checkpoint at seq {checkpoint.seq}: {checkpoint.hash}")
    try:
        anchor = anchor_head(db.session, anchoring)
    except OSError as exc:
        _fail(f"Could not append the anchor to {anchoring.store.where}: {exc.strerror}.")
    db.session.rollback()
    if anchor is not None:
        click.echo(f"Signed anchor of seq {anchor.seq} appended to {anchoring.store.where}.")
    if checkpoint is None and anchor is None:
        click.echo("No new events since the last checkpoint.")


@click.group("memories", help="Memory upkeep: the truth check, the erasure VACUUM.")
def memories_group() -> None:
    pass


@memories_group.command("verify")
@click.option("--user", "email", default=None, help="Check this user only (an email).")
@click.option("--no-repair", is_flag=True, help="Report only: request no repair builds.")
@with_appcontext
def memories_verify(email: str | None, no_repair: bool) -> None:
    """The truth check: every user's stored chunks against what their plan, flags and
    records allow now. Each finding is audited (counts only) and, unless --no-repair,
    repaired by a full rebuild. Exit status 1 when something was found."""
    user_ids = None
    if email is not None:
        user = accounts.get_user_by_email(db.session, email)
        if user is None:
            raise click.ClickException(f"No user has the email {email!r}.")
        user_ids = [user.id]
    settings = settings_from(current_app.config)
    report = verify_memory(
        db.session, ann_threshold=settings.ann_min_chunks,
        ann_leave=settings.ann_leave_chunks, user_ids=user_ids, repair=not no_repair,
        actor=CLI_ACTOR)
    db.session.commit()
    click.echo(f"Checked {report.users_checked} users and {report.chunks_checked} chunks "
               f"({report.users_pending} with a build due, not judged).")
    for v in report.violations:
        where = f" in {v.source_key}" if v.source_key else ""
        click.echo(f"  user {v.user_id}: {v.count} × {VIOLATION_KINDS[v.kind]}{where}")
    if report.violations:
        click.echo(f"{len(report.violations)} findings for {report.users_with_violations} "
                   f"users; {report.repairs_requested} repair builds requested.")
        raise SystemExit(1)
    click.echo("Nothing found.")


@memories_group.command("vacuum")
@with_appcontext
def memories_vacuum() -> None:
    """VACUUM the memory tables now if redactions or hard deletes wait for it, and record
    it on their erasure receipts (workers also do this periodically). Exit status 1 when
    the database refused the VACUUM."""
    db.session.commit()  # nothing of ours open while the VACUUM runs
    result = vacuum_after_erasures(db.session)
    click.echo(result.describe())
    if result.refused:
        raise SystemExit(1)
