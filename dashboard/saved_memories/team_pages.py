"""``/teams/<slug>/memories``: a team's saved memories as its members reach them — who
saved each one with what (``reach.attribute``), filters by author and app, "Save to
<team>", and change, forget, redact, restore and (owners and admins) erase for good,
each as the member's role and the team's policies allow (``access.may``, through
``reach.find_for``), behind confirmation pages that work without JS, with receipts.

This package does not import teams (which builds on it): the team is the caller's seat
in their ``Reach`` (``dashboard.access``). Not a member: the same 404 as no such team."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn

from flask import Blueprint, abort, flash, redirect, render_template, request, url_for
from flask_login import current_user, login_required
from flask_wtf import FlaskForm
from sqlalchemy import Integer, String, column, func, select, table
from wtforms import TextAreaField

from dashboard.access import Action, Reach, TeamSeat, may, members_among, reach_of
from dashboard.audit.services import Actor
from dashboard.auth.models import User
from dashboard.errors import refusal_status
from dashboard.extensions import db
from dashboard.ids import parse_id
from dashboard.plans.web import sentence_for
from dashboard.refusals import Refusal
from dashboard.saved_memories import editing, forgetting, rules
from dashboard.saved_memories import reach as reached
from dashboard.saved_memories.forgetting import REDACTED
from dashboard.saved_memories.models import MEMORY_STATUSES, ApiKey, ForgetMarker, Memory
from dashboard.saved_memories.pages import MODE_LABELS, ForgetForm, RestoreForm, backup_horizon
from dashboard.saved_memories.receipts import find_receipt, receipts_of_memory
from dashboard.saved_memories.rules import (
    MAX_CONTENT,
    SCOPE_FOR_OPERATION,
    InvalidMemoryInput,
    MemoryBusy,
    MemoryConflict,
    MemoryGone,
)
from dashboard.sources import SAVED

bp = Blueprint("team_memories", __name__, url_prefix="/teams/<slug>/memories")

PAGE_SIZE = 20
RECEIPTS_PAGE = 50
STATUS_FILTERS = ("all", *MEMORY_STATUSES)
MODES = ("soft_delete", "redact", "hard_delete")
# The same words as every other team page gives someone who is not a member.
NO_SUCH_TEAM = "You are in no team with that name."
# On the team's pages a member acts in person: their role and the team's policies decide
# (``access.may``: erasing for good is for owners and admins), not a credential's scopes.
PAGE_SCOPES = tuple(SCOPE_FOR_OPERATION.values())
# Saving the same words again this soon is the same click: it answers as the first did.
SAME_SAVE = timedelta(seconds=60)
# Namespace of the advisory lock a person's team saves take turns on (the other half is
# the person's id): two clicks at once find each other's memory.
SAVE_LOCK_NAMESPACE = 0x7EA5
_CLIENTS = table("oauth_clients", column("id", Integer), column("client_id", String),
                 column("name", String))

BAD_STATUS = "Show all, active, deleted or redacted memories: the status in the address " \
             "is none of these."
BAD_CURSOR = "This page's position in the address is not one these pages gave out. " \
             "Start again from the newest memories."
BAD_MODE = "A team memory can be forgotten (soft_delete), redacted (redact) or, by an " \
           "owner or admin, erased for good (hard_delete)."


class SaveForm(FlaskForm):
    content = TextAreaField("Memory", render_kw={"rows": 3, "maxlength": MAX_CONTENT})


class EditForm(FlaskForm):
    content = TextAreaField("Memory", render_kw={"rows": 5, "maxlength": MAX_CONTENT})


def _refuse(exc: Refusal) -> NoReturn:
    abort(refusal_status(exc), exc.sentence)


def _seat(slug: str) -> tuple[Reach, TeamSeat]:
    reach = reach_of(db.session, current_user.id)
    seat = reach.by_slug(slug)
    if seat is None:
        abort(404, NO_SUCH_TEAM)
    return reach, seat


def _find(reach: Reach, seat: TeamSeat, memory_id: object, operation: str) -> Memory:
    """The team's memory, if the member's role allows ``operation`` on it: 404 for one
    that is not the team's (a personal or another team's too), 410 erased, 403 a role."""
    try:
        memory = reached.find_for(db.session, reach, memory_id, operation=operation,
                                  scopes=PAGE_SCOPES, acting=False)
    except Refusal as exc:
        _refuse(exc)
    if memory.owner_id != seat.team_id:
        abort(404, rules.NOT_FOUND)
    return memory


def _context(seat: TeamSeat) -> dict[str, Any]:
    """What the team's nav needs (``teams/_nav.html``)."""
    return {"team": seat, "seat": seat}


def _field_error(form: FlaskForm, exc: InvalidMemoryInput) -> bool:
    field = getattr(form, exc.field, None) if exc.field else None
    if field is None:
        return False
    field.errors = [*field.errors, exc.sentence]
    return True


def _done_already(seat: TeamSeat, memory_id: object, mode: str) -> int | None:
    """The receipt of ``mode`` this person just got for this memory, if its latest
    receipt is that (a double click): the second click answers with the first's."""
    parsed = rules.parse_memory_id(memory_id)
    if parsed is None:
        return None
    latest = db.session.scalars(select(ForgetMarker).where(
        ForgetMarker.memory_id == parsed, ForgetMarker.owner_id == seat.team_id)
        .order_by(ForgetMarker.id.desc()).limit(1)).first()
    if latest is None or latest.mode != mode or latest.actor_type != Actor.of(
            current_user).kind or latest.actor_id != str(current_user.id):
        return None
    return latest.id


# -- the list, the filters, saving ----------------------------------------------------------

def _filter_options(seat: TeamSeat) -> tuple[list[tuple[int, str]], list[tuple[str, str]]]:
    """Authors (current members who saved to the team) and apps (the keys and apps its
    memories came through, a former member's key left out), for the filter menus."""
    rows = db.session.execute(
        select(Memory.author_id, Memory.api_key_id, Memory.oauth_client_pk)
        .where(Memory.owner_id == seat.team_id).distinct()).all()
    author_ids = {a for a, _, _ in rows if a is not None}
    current = {user for _, user in members_among(db.session, {(seat.team_id, a)
                                                              for a in author_ids})}
    people = {u.id: u for u in db.session.scalars(select(User).where(User.id.in_(current)))} \
        if current else {}
    authors = sorted(((uid, "you" if uid == current_user.id else (u.display_name or u.email))
                      for uid, u in people.items()), key=lambda item: item[1].lower())
    key_ids = {k for _, k, _ in rows if k is not None}
    keys = list(db.session.scalars(select(ApiKey).where(ApiKey.id.in_(key_ids),
                                                        ApiKey.owner_id.in_(current)))) \
        if key_ids and current else []
    client_pks = {c for _, _, c in rows if c is not None}
    clients = list(db.session.execute(select(_CLIENTS).where(_CLIENTS.c.id.in_(client_pks)))) \
        if client_pks else []
    apps = [("orbitpilot", "OrbitPilot (these pages)")]
    apps += [(f"key:{k.id}", f"API key \u201c{k.name}\u201d ({k.prefix}\u2026)")
             for k in sorted(keys, key=lambda k: k.id)]
    apps += [(c.client_id, f"app {c.client_id} (\u201c{c.name}\u201d)")
             for c in sorted(clients, key=lambda c: c.id)]
    return authors, apps


def _index_page(reach: Reach, seat: TeamSeat, form: SaveForm, status: int = 200) -> Any:
    state = request.args.get("status") or "all"
    if state not in STATUS_FILTERS:
        abort(400, BAD_STATUS)
    cursor = request.args.get("cursor") or None
    try:
        filters = reached.Filters.parse(team=seat.slug, author=request.args.get("author"),
                                        app=request.args.get("app"))
        page = reached.list_for(db.session, reach, filters=filters,
                                status=None if state == "all" else state, limit=PAGE_SIZE,
                                cursor=cursor)
    except InvalidMemoryInput as exc:
        abort(400, BAD_CURSOR if exc.field == "cursor" else exc.sentence)
    attributions = reached.attribute(db.session, reach, page.items)
    authors, apps = _filter_options(seat)
    account = db.session.get(User, seat.team_id)
    source, sentence = sentence_for(account, SAVED)
    args = {"author": filters.author, "app": filters.app,
            "status": None if state == "all" else state}
    return render_template(
        "memories/team_memories.html", page=page, attributions=attributions, form=form,
        status=state, statuses=STATUS_FILTERS, cursor=cursor, filters=filters, args=args,
        authors=authors, apps=apps, source=source, sentence=sentence,
        may_write=may(seat, Action.WRITE), can=_abilities(seat), **_context(seat)), status


def _abilities(seat: TeamSeat) -> dict[str, dict[bool, bool]]:
    """action → {author?: may}: what each memory's actions show."""
    return {action.value: {mine: may(seat, action, author=mine) for mine in (False, True)}
            for action in (Action.EDIT, Action.FORGET, Action.REDACT, Action.HARD_DELETE)}


def _same_save(seat: TeamSeat, content: str) -> Memory | None:
    """This person's identical save to the team from these pages a moment ago."""
    return db.session.scalars(select(Memory).where(
        Memory.owner_id == seat.team_id, Memory.author_id == current_user.id,
        Memory.api_key_id.is_(None), Memory.oauth_client_pk.is_(None),
        Memory.content == content, Memory.status == "active",
        Memory.created_at > datetime.now(UTC) - SAME_SAVE).limit(1)).first()


@bp.route("/", methods=["GET", "POST"])
@login_required
def index(slug: str):
    """The team's memories, newest first, with ``?author=``, ``?app=``, ``?status=`` and
    ``?cursor=``; POST saves one to the team (a member whose role may write)."""
    reach, seat = _seat(slug)
    form = SaveForm()
    if request.method != "POST":  # GET and HEAD show; only a POST changes
        return _index_page(reach, seat, form)
    if not may(seat, Action.WRITE):
        abort(403, f"Your role in {seat.name} ({seat.role}) does not let you save to it.")
    if not form.validate_on_submit():
        return _index_page(reach, seat, form, 400)
    content = form.content.data or ""
    db.session.execute(select(func.pg_advisory_xact_lock(SAVE_LOCK_NAMESPACE,
                                                         current_user.id)))
    again = _same_save(seat, content)
    if again is not None:
        db.session.rollback()
        flash(f"Saved to {seat.name}.", "success")
        return redirect(url_for("team_memories.index", slug=slug,
                                _anchor=f"memory-{again.id}"), 303)
    try:
        saved = reached.save_for(db.session, reach, team=seat.slug, content=content,
                                 source="orbitpilot", actor=Actor.of(current_user))
    except InvalidMemoryInput as exc:
        db.session.rollback()
        if _field_error(form, exc):
            return _index_page(reach, seat, form, 400)
        _refuse(exc)
    except Refusal as exc:
        db.session.rollback()
        _refuse(exc)
    memory_id, sentence = saved.memory.id, saved.sentence
    db.session.commit()
    flash(f"Saved to {seat.name}." + ("" if saved.remembered else f" {sentence}"), "success")
    return redirect(url_for("team_memories.index", slug=slug, _anchor=f"memory-{memory_id}"),
                    303)


# -- changing one -----------------------------------------------------------------------------

@bp.route("/<memory_id>/edit", methods=["GET", "POST"])
@login_required
def edit(slug: str, memory_id: str):
    """GET shows the memory in a form; POST saves its new words (a new version)."""
    reach, seat = _seat(slug)
    memory = _find(reach, seat, memory_id, "update")
    form = EditForm(data={"content": memory.content} if request.method != "POST" else None)

    def page(status: int = 200, error: str | None = None) -> Any:
        return render_template("memories/team_memory_edit.html", memory=memory, form=form,
                               error=error, **_context(seat)), status

    if request.method != "POST":
        return page()
    if not form.validate_on_submit():
        return page(400)
    content = form.content.data or ""
    back = url_for("team_memories.index", slug=slug, _anchor=f"memory-{memory.id}")
    if memory.status == "active" and content == memory.content:  # nothing new (a 2nd click)
        flash("Memory saved.", "success")
        return redirect(back, 303)
    try:
        editing.change_memory(db.session, memory.owner_id, memory.id, content=content,
                               actor=Actor.of(current_user))
    except InvalidMemoryInput as exc:
        db.session.rollback()
        if _field_error(form, exc):
            return page(400)
        _refuse(exc)
    except (MemoryBusy, MemoryConflict) as exc:
        db.session.rollback()
        return page(refusal_status(exc), exc.sentence)
    except Refusal as exc:
        db.session.rollback()
        _refuse(exc)
    db.session.commit()
    flash("Memory saved: the team's memory recalls the new words after its next update.",
          "success")
    return redirect(back, 303)


def _mode(values: Any) -> str:
    mode = values.get("mode") or "soft_delete"
    if mode not in MODES:
        abort(400, BAD_MODE)
    return mode


@bp.route("/<memory_id>/forget", methods=["GET", "POST"])
@login_required
def forget(slug: str, memory_id: str):
    """GET ``?mode=soft_delete|redact|hard_delete`` says what will happen and asks; POST
    does it and goes to the receipt. A second click goes to the first one's receipt."""
    reach, seat = _seat(slug)
    values = request.form if request.method == "POST" else request.args
    mode = _mode(values)
    if request.method == "POST":
        try:
            memory = reached.find_for(db.session, reach, memory_id, operation=mode,
                                      scopes=PAGE_SCOPES, acting=False)
        except MemoryGone as exc:
            done = _done_already(seat, memory_id, mode)
            if done is None:
                _refuse(exc)
            return redirect(url_for("team_memories.receipt", slug=slug, marker_id=done), 303)
        except Refusal as exc:
            _refuse(exc)
        if memory.owner_id != seat.team_id:
            abort(404, rules.NOT_FOUND)
    else:
        memory = _find(reach, seat, memory_id, mode)
    form = ForgetForm(mode=mode)

    def page(status: int = 200, error: str | None = None) -> Any:
        return render_template("memories/team_memory_forget.html", memory=memory, form=form,
                               mode=mode, error=error, redacted=REDACTED,
                               attribution=reached.attribute(db.session, reach,
                                                             [memory])[memory.id],
                               **_context(seat)), status

    if request.method != "POST":  # GET and HEAD show; only a POST changes
        return page()
    if not form.validate_on_submit():
        return page(400)
    replacement = form.replacement_content.data if mode == "redact" else None
    memory_key = memory.id
    try:
        receipt = forgetting.forget_memory(
            db.session, memory.owner_id, memory.id, mode=mode, actor=Actor.of(current_user),
            scopes=PAGE_SCOPES, reason=form.reason.data,
            replacement_content=replacement if replacement and replacement.strip() else None)
    except InvalidMemoryInput as exc:
        db.session.rollback()
        if _field_error(form, exc):
            return page(400)
        _refuse(exc)
    except MemoryBusy as exc:
        db.session.rollback()
        return page(refusal_status(exc), exc.sentence)
    except (MemoryConflict, MemoryGone) as exc:
        db.session.rollback()
        done = _done_already(seat, memory_key, mode)
        if done is not None:
            return redirect(url_for("team_memories.receipt", slug=slug, marker_id=done), 303)
        if isinstance(exc, MemoryGone):
            _refuse(exc)
        memory = db.session.get(Memory, memory_key) or memory
        return page(refusal_status(exc), exc.sentence)
    except Refusal as exc:
        db.session.rollback()
        _refuse(exc)
    marker_id, pending = receipt.marker_id, receipt.pending
    db.session.commit()
    if pending:
        flash("The team is under a legal hold: the memory is forgotten now (no longer "
              "recalled), and the erasure completes when the hold ends.", "warning")
    elif mode == "hard_delete":
        flash("Memory erased for good, with every copy OrbitPilot made of it. This cannot "
              "be undone.", "success")
    elif mode == "redact":
        flash("Memory redacted: its content was replaced and the content of its earlier "
              "versions erased. This cannot be undone.", "success")
    else:
        flash("Memory forgotten: it is no longer recalled. It can be restored from the "
              "team's memories.", "success")
    return redirect(url_for("team_memories.receipt", slug=slug, marker_id=marker_id), 303)


@bp.route("/<memory_id>/restore", methods=["GET", "POST"])
@login_required
def restore(slug: str, memory_id: str):
    """GET asks; POST makes a forgotten team memory active again."""
    reach, seat = _seat(slug)
    memory = _find(reach, seat, memory_id, "restore")
    form = RestoreForm()

    def page(status: int = 200, error: str | None = None) -> Any:
        return render_template("memories/team_memory_restore.html", memory=memory,
                               form=form, error=error, **_context(seat)), status

    if request.method != "POST":
        return page()
    if not form.validate_on_submit():
        return page(400)
    memory_key = memory.id
    try:
        forgetting.restore_memory(db.session, memory.owner_id, memory.id,
                                actor=Actor.of(current_user), scopes=PAGE_SCOPES,
                                reason=form.reason.data)
    except InvalidMemoryInput as exc:
        db.session.rollback()
        if _field_error(form, exc):
            return page(400)
        _refuse(exc)
    except MemoryConflict as exc:
        db.session.rollback()
        if _done_already(seat, memory_key, "restore") is not None:
            return redirect(url_for("team_memories.index", slug=slug,
                                    _anchor=f"memory-{memory_key}"), 303)
        memory = db.session.get(Memory, memory_key) or memory
        return page(refusal_status(exc), exc.sentence)
    except Refusal as exc:
        db.session.rollback()
        _refuse(exc)
    db.session.commit()
    flash("Memory restored: it is recalled again after the team's next memory update.",
          "success")
    return redirect(url_for("team_memories.index", slug=slug, _anchor=f"memory-{memory_key}"),
                    303)


# -- receipts ---------------------------------------------------------------------------------

@bp.route("/receipts/")
@login_required
def receipts(slug: str):
    """The team's erasure receipts, newest first (``?before=`` a receipt id for older)."""
    _, seat = _seat(slug)
    before = request.args.get("before")
    query = select(ForgetMarker).where(ForgetMarker.owner_id == seat.team_id)
    if before is not None:
        before_id = parse_id(before)
        if before_id is None:
            abort(400, BAD_CURSOR)
        query = query.where(ForgetMarker.id < before_id)
    rows = list(db.session.scalars(query.order_by(ForgetMarker.id.desc())
                                   .limit(RECEIPTS_PAGE + 1)))
    older = rows[RECEIPTS_PAGE - 1].id if len(rows) > RECEIPTS_PAGE else None
    return render_template("memories/team_receipts.html", markers=rows[:RECEIPTS_PAGE],
                           older=older, moved=before is not None, modes=MODE_LABELS,
                           **_context(seat))


@bp.route("/receipts/<marker_id>")
@login_required
def receipt(slug: str, marker_id: str):
    """One receipt of the team's (ids, states, counts, the audit event; no content),
    with the other receipts of the same memory."""
    _, seat = _seat(slug)
    try:
        shown = find_receipt(db.session, seat.team_id, marker_id)
    except Refusal as exc:
        _refuse(exc)
    others = receipts_of_memory(db.session, seat.team_id, shown.memory_id)
    memory = db.session.scalars(select(Memory).where(
        Memory.id == uuid.UUID(shown.memory_id), Memory.owner_id == seat.team_id)).first()
    can_restore = memory is not None and may(seat, Action.FORGET,
                                             author=memory.author_id == current_user.id)
    return render_template("memories/team_memory_receipt.html", receipt=shown,
                           receipts=others, modes=MODE_LABELS, alive=memory is not None,
                           backups=backup_horizon(shown.created_at), can_restore=can_restore,
                           **_context(seat))
