"""``flask worker`` and ``flask builds``: registered through the ``flask.commands`` entry
point (pyproject.toml), so the app never imports this package."""

from __future__ import annotations

import click
from flask import current_app
from flask.cli import with_appcontext

from dashboard import memory
from dashboard.audit.services import CLI_ACTOR, record_event
from dashboard.auth import services as accounts
from dashboard.extensions import db
from dashboard.orbitpilot import conversations as chat
from dashboard.plans.services import UnknownPlan, find_plan
from dashboard.queues import build_queue
from jobs.worker import run_worker


def _fail(message: str) -> None:
    raise click.ClickException(message)


@click.command("worker")
@click.option("--burst", is_flag=True, help="work until the queue is empty, then exit")
@click.option("--simple", is_flag=True, help="run jobs in this process (no fork per job)")
@with_appcontext
def worker_command(burst: bool, simple: bool) -> None:
    """Run a build worker (RQ) with the app context, plus sweeping and the schedule."""
    run_worker(current_app._get_current_object(), burst=burst, simple=simple)


@click.group("builds", help="Memory builds: request, sweep, schedule.")
def builds_group() -> None:
    pass


@builds_group.command("request")
@click.option("--user", "email", default=None, help="one user's email")
@click.option("--plan", "plan_ref", default=None, help="every user of a plan (slug or name)")
@click.option("--mode", type=click.Choice(["quick", "full"]), default="quick",
              show_default=True)
@with_appcontext
def builds_request(email: str | None, plan_ref: str | None, mode: str) -> None:
    """Request a build for one user or a whole plan (committed a batch at a time)."""
    if bool(email) == bool(plan_ref):
        _fail("Give exactly one of --user or --plan.")
    if email:
        user = accounts.get_user_by_email(db.session, email)
        if user is None:
            _fail(f"No account with email {email!r}.")
        (request,) = memory.request_builds_by_staff(db.session, [user.id], mode=mode,
                                                    actor=CLI_ACTOR)
        db.session.commit()
        state = "merged into queued build" if request.merged else "queued as build"
        click.echo(f"{user.email}: {state} {request.build_id}")
        return
    try:
        plan = find_plan(db.session, plan_ref)
    except UnknownPlan as exc:
        _fail(exc.sentence)
    # Also notes the plan as fanned out: every active user has just been requested.
    total = memory.fan_out_plan_builds(db.session, plan.id,
                                       batch_size=build_queue().settings.fanout_batch,
                                       mode=mode, trigger="admin")
    # Recorded once the requests are in, in a short transaction of its own: the chain's
    # lock is never held across the batches.
    record_event(db.session, action="build.request_plan", actor=CLI_ACTOR, target_type="plan",
                 target_id=plan.id, mode=mode, details={"users": total})
    db.session.commit()
    click.echo(f"{plan.slug}: requested {mode} builds for {total} user(s)")


@builds_group.command("sweep")
@with_appcontext
def builds_sweep() -> None:
    """Fail builds whose worker died; push queued builds whose job was lost."""
    result = memory.sweep_builds(db.session, build_queue())
    db.session.commit()
    click.echo(f"failed {result.failed}, re-enqueued {result.requeued}")


@builds_group.command("schedule")
@click.option("--all", "everyone", is_flag=True, help="every active user, changed or not")
@with_appcontext
def builds_schedule(everyone: bool) -> None:
    """Cron-friendly: request quick builds for users whose memory inputs changed."""
    settings = build_queue().settings
    idle = chat.request_idle_conversation_builds(db.session,
                                                   idle_minutes=settings.idle_minutes)
    scheduled = memory.request_scheduled_builds(
        db.session, margin_seconds=settings.schedule_margin_seconds, everyone=everyone)
    db.session.commit()
    click.echo(f"requested {scheduled} scheduled and {idle} idle-conversation build(s)")
