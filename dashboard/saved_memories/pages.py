"""``/memories``: a signed-in user's saved memories — the list, forget (soft delete), redact
and restore behind a confirmation page that works without JS, and the erasure receipts.
The rules are the service's (called with ``scopes=None``: everything but a hard delete);
a refusal shows its sentence with its status. ``/memories/forget`` and ``/restore`` take
the id from the form, so every endpoint can be built without an argument."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn

from flask import (
    Blueprint,
    abort,
    current_app,
    flash,
    redirect,
    render_template,
    request,
    url_for,
)
from flask_login import current_user, login_required
from flask_wtf import FlaskForm
from wtforms import HiddenField, SelectField, TextAreaField
from wtforms.fields import SelectChoice

from dashboard.access import Action, TeamSeat, may, reach_of
from dashboard.audit.services import Actor
from dashboard.errors import refusal_status
from dashboard.extensions import db
from dashboard.plans.web import sentence_for
from dashboard.refusals import Refusal
from dashboard.saved_memories import forgetting, listing, rules
from dashboard.saved_memories import reach as reached
from dashboard.saved_memories.forgetting import REDACTED
from dashboard.saved_memories.models import MEMORY_STATUSES, Memory
from dashboard.saved_memories.receipts import find_receipt, receipts_of_memory
from dashboard.saved_memories.rules import (
    MAX_CONTENT,
    MAX_REASON,
    InvalidMemoryInput,
    MemoryBusy,
    MemoryConflict,
)
from dashboard.sources import SAVED

bp = Blueprint("memories", __name__, url_prefix="/memories")

PAGE_SIZE = 20
STATUS_FILTERS = ("all", *MEMORY_STATUSES)
# The modes these pages offer; hard delete is the API's.
PAGE_MODES = ("soft_delete", "redact")
SOURCE_LABELS = {"chatgpt": "ChatGPT", "claude": "Claude", "codex": "Codex",
                 "copilot": "Copilot", "api": "API", "orbitpilot": "OrbitPilot",
                 "connector": "a connected app"}
MODE_LABELS = {"soft_delete": "Forget (soft delete)", "redact": "Redact",
               "hard_delete": "Permanent deletion", "restore": "Restore"}

BAD_STATUS = "Show all, active, deleted or redacted memories: the status in the address " \
             "is none of these."
BAD_CURSOR = "This page's position in the address is not one these pages gave out. " \
             "Start again from your newest memories."
BAD_MODE = "A memory can be forgotten (soft_delete) or redacted (redact) here."
HARD_DELETE = "Permanent deletion is done through the memory API, with a key an " \
              "administrator granted memory:hard_delete."


@bp.app_template_global("memory_source_label")
def memory_source_label(source: str, client_name: str | None = None) -> str:
    """Who saved a memory, as its badge says it: a connected app by its own name."""
    label = SOURCE_LABELS.get(source, source)
    return f"{client_name} ({label})" if client_name and client_name != label else label


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


# A receipt's copies, by kind (``dashboard.copies``): what the erasure did, what the probe
# counted. Counts only: a receipt never holds the words.
COPY_REMOVED = {
    "replies": lambda n: f"{_count(n, 'chat reply', 'chat replies')} rewritten: the item's "
                         f"words replaced by {REDACTED}",
    "drew_on": lambda n: f"{_count(n, '“Drew on” record', '“Drew on” records')} naming it "
                         "deleted",
    "exports": lambda n: f"{_count(n, 'export', 'exports')} withdrawn (made before, so they "
                         "held it)",
    "export_parts": lambda n: f"{_count(n, 'stored export piece', 'stored export pieces')} "
                              "deleted",
}
COPY_LEFT = {
    "chunks": lambda n: f"{_count(n, 'chunk', 'chunks')} of it in your memory",
    "replies": lambda n: f"{_count(n, 'reply', 'replies')} holding its words, among every "
                         "reply of the conversations that drew on it",
    "drew_on": lambda n: f"{_count(n, '“Drew on” record', '“Drew on” records')} naming it",
    "exports": lambda n: f"{_count(n, 'export', 'exports')} from before it still "
                         "downloadable or being made",
    "export_parts": lambda n: f"{_count(n, 'stored piece', 'stored pieces')} of your exports",
}


@bp.app_template_global("copy_removed")
def copy_removed(kind: str, n: int) -> str:
    return COPY_REMOVED[kind](n) if kind in COPY_REMOVED else f"{kind}: {n} removed"


@bp.app_template_global("copy_left")
def copy_left(kind: str, n: int) -> str:
    return COPY_LEFT[kind](n) if kind in COPY_LEFT else f"{kind}: {n} found"


class ForgetForm(FlaskForm):
    # The service validates lengths and text; the form only carries values (and CSRF).
    mode = HiddenField()
    reason = TextAreaField("Reason (optional, kept on the receipt)",
                           render_kw={"rows": 2, "maxlength": MAX_REASON})
    replacement_content = TextAreaField(
        "Replacement text (optional)",
        render_kw={"rows": 3, "maxlength": MAX_CONTENT, "placeholder": REDACTED})


class RestoreForm(FlaskForm):
    reason = TextAreaField("Reason (optional, kept on the receipt)",
                           render_kw={"rows": 2, "maxlength": MAX_REASON})


class ShareForm(FlaskForm):
    team = SelectField("Team to share it with", choices=[], validate_choice=False)


def _refuse(exc: Refusal) -> NoReturn:
    abort(refusal_status(exc), exc.sentence)


def _find(raw_id: object) -> Memory:
    """The signed-in user's memory, else the service's 404 (unknown, someone else's,
    malformed — one answer) or 410 (hard-deleted)."""
    try:
        return rules.find_memory(db.session, current_user.id, raw_id)
    except Refusal as exc:
        _refuse(exc)


def _memory_id(memory_id: str | None) -> object:
    return memory_id if memory_id is not None else request.form.get("memory_id")


def _field_error(form: FlaskForm, exc: InvalidMemoryInput) -> bool:
    """Put a refused value's sentence on its field; ``False`` if the form has none."""
    field = getattr(form, exc.field, None) if exc.field else None
    if field is None:
        return False
    field.errors = [*field.errors, exc.sentence]
    return True


@bp.route("/")
@login_required
def index():
    """The user's saved memories, newest first, a page at a time (``?cursor=``), with
    ``?status=`` all, active, deleted or redacted."""
    status = request.args.get("status") or "all"
    if status not in STATUS_FILTERS:
        abort(400, BAD_STATUS)
    cursor = request.args.get("cursor") or None
    try:
        page = listing.list_memories(db.session, current_user.id,
                                      status=None if status == "all" else status,
                                      limit=PAGE_SIZE, cursor=cursor)
    except InvalidMemoryInput:
        abort(400, BAD_CURSOR)
    source, sentence = sentence_for(current_user, SAVED)
    return render_template("memories/memories.html", page=page, status=status, cursor=cursor,
                           statuses=STATUS_FILTERS, source=source, sentence=sentence,
                           hard_delete=HARD_DELETE, share=bool(_share_seats()))


@bp.route("/<memory_id>")
@login_required
def detail(memory_id: str):
    """One memory and the receipts of everything done to it."""
    memory = _find(memory_id)
    receipts = receipts_of_memory(db.session, current_user.id, memory.id)
    return render_template("memories/memory_detail.html", memory=memory, receipts=receipts,
                           modes=MODE_LABELS, hard_delete=HARD_DELETE)


def _forget_page(memory: Memory, form: ForgetForm, mode: str, status: int = 200,
                 error: str | None = None):
    return render_template("memories/memory_forget.html", memory=memory, form=form, mode=mode,
                           error=error, redacted=REDACTED), status


@bp.route("/<memory_id>/forget", methods=["GET", "POST"])
@bp.route("/forget", methods=["POST"])
@login_required
def forget(memory_id: str | None = None):
    """GET ``?mode=soft_delete|redact`` says what will happen and asks; POST does it and
    goes to the receipt."""
    memory = _find(_memory_id(memory_id))
    values = request.form if request.method == "POST" else request.args
    mode = values.get("mode") or "soft_delete"
    if mode == "hard_delete":
        abort(403, HARD_DELETE)
    if mode not in PAGE_MODES:
        abort(400, BAD_MODE)
    form = ForgetForm(mode=mode)
    if request.method != "POST":  # GET and HEAD show; only a POST changes
        return _forget_page(memory, form, mode)
    if not form.validate_on_submit():
        return _forget_page(memory, form, mode, 400)
    replacement = form.replacement_content.data if mode == "redact" else None
    try:
        receipt = forgetting.forget_memory(
            db.session, current_user.id, memory.id, mode=mode, actor=Actor.of(current_user),
            scopes=None, reason=form.reason.data,
            # An empty box means the default, "[REDACTED]".
            replacement_content=replacement if replacement and replacement.strip() else None)
    except InvalidMemoryInput as exc:
        if _field_error(form, exc):
            return _forget_page(memory, form, mode, 400)
        _refuse(exc)
    except MemoryBusy as exc:
        db.session.rollback()  # the wait that timed out ended the transaction
        return _forget_page(memory, form, mode, refusal_status(exc), exc.sentence)
    except MemoryConflict as exc:
        return _forget_page(memory, form, mode, refusal_status(exc), exc.sentence)
    except Refusal as exc:
        _refuse(exc)
    db.session.commit()
    if receipt.pending:
        flash("Your account is under a legal hold: the memory is forgotten now (no longer "
              "recalled), and the redaction completes when the hold ends.", "warning")
    elif mode == "redact":
        flash("Memory redacted: its content was replaced, the content of its earlier "
              "versions erased, its words taken out of the chat replies that quoted it, and "
              "any export holding it withdrawn. This cannot be undone.", "success")
    else:
        flash("Memory forgotten: it is no longer recalled. You can restore it from your "
              "saved memories.", "success")
    return redirect(url_for("memories.receipt", marker_id=receipt.marker_id))


@bp.route("/<memory_id>/restore", methods=["GET", "POST"])
@bp.route("/restore", methods=["POST"])
@login_required
def restore(memory_id: str | None = None):
    """GET asks; POST makes a forgotten (soft-deleted) memory active again."""
    memory = _find(_memory_id(memory_id))
    form = RestoreForm()

    def page(status: int = 200, error: str | None = None) -> Any:
        return render_template("memories/memory_restore.html", memory=memory, form=form,
                               error=error), status

    if request.method != "POST":  # GET and HEAD show; only a POST changes
        return page()
    if not form.validate_on_submit():
        return page(400)
    try:
        forgetting.restore_memory(db.session, current_user.id, memory.id,
                                actor=Actor.of(current_user), scopes=None,
                                reason=form.reason.data)
    except InvalidMemoryInput as exc:
        if _field_error(form, exc):
            return page(400)
        _refuse(exc)
    except MemoryConflict as exc:
        return page(refusal_status(exc), exc.sentence)
    except Refusal as exc:
        _refuse(exc)
    memory_id = str(memory.id)  # read before the commit expires the row
    db.session.commit()
    flash("Memory restored: it will be recalled again after your next memory update.",
          "success")
    return redirect(url_for("memories.detail", memory_id=memory_id))


def _share_seats() -> list[TeamSeat]:
    """The teams the signed-in person may share to (their role, the team's policy)."""
    seats = reach_of(db.session, current_user.id).seats.values()
    return sorted((s for s in seats if may(s, Action.SHARE)), key=lambda s: s.name.lower())


@bp.route("/<memory_id>/share", methods=["GET", "POST"])
@login_required
def share(memory_id: str):
    """GET asks which team to share the memory with; POST copies it there with its
    provenance (``reach.share_to_team``), deliberately: the original stays the person's.
    A second click finds the copy the first made and answers as it did."""
    memory = _find(memory_id)
    seats = _share_seats()
    form = ShareForm()
    form.team.choices = [SelectChoice(s.slug, s.name) for s in seats]

    def page(status: int = 200, error: str | None = None) -> Any:
        return render_template("memories/memory_share.html", memory=memory, form=form,
                               seats=seats, error=error), status

    if request.method != "POST":  # GET and HEAD show; only a POST changes
        return page()
    if not form.validate_on_submit():
        return page(400)
    seat = next((s for s in seats if s.slug == form.team.data), None)
    if seat is None:
        form.team.errors = [*form.team.errors, "Choose one of your teams from the list."]
        return page(400)
    # A second click finds the copy the first made (the service's row lock orders them).
    try:
        copy = reached.share_to_team(db.session, reach_of(db.session, current_user.id),
                                     memory.id, seat.slug,
                                     actor=Actor.of(current_user)).memory.id
    except MemoryConflict as exc:
        db.session.rollback()
        return page(refusal_status(exc), exc.sentence)
    except Refusal as exc:
        db.session.rollback()
        _refuse(exc)
    db.session.commit()
    flash(f"Shared with {seat.name}: a copy of it is now the team's memory (yours stays "
          "yours).", "success")
    return redirect(url_for("team_memories.index", slug=seat.slug, _anchor=f"memory-{copy}"),
                    303)


@bp.route("/receipts/<marker_id>")
@login_required
def receipt(marker_id: str):
    """An erasure receipt: ids, states, counts, the audit event and the vacuum — no
    content. With the other receipts of the same memory."""
    try:
        shown = find_receipt(db.session, current_user.id, marker_id)
    except Refusal as exc:
        _refuse(exc)
    receipts = receipts_of_memory(db.session, current_user.id, shown.memory_id)
    return render_template("memories/memory_receipt.html", receipt=shown, receipts=receipts,
                           modes=MODE_LABELS, backups=backup_horizon(shown.created_at))


def backup_horizon(done_at: datetime) -> str:
    """Where copies of what was erased may still be: backups, until they expire."""
    days = current_app.config.get("BACKUP_RETENTION_DAYS")
    if days:
        expires = (done_at + timedelta(days=days)).astimezone(UTC)
        return (f"Copies in backups expire by {expires:%Y-%m-%d} (backups are kept "
                f"{days} days).")
    binding = current_app.extensions.get("orbitpilot.embedded")
    if binding is not None and binding.postgres:
        return "No backups: the embedded database keeps no copies."
    return ("Not stated: this server's operator keeps its backups, and has not said for "
            "how long (BACKUP_RETENTION_DAYS).")
