"""Chat with OrbitPilot: the full-screen chat, the dock on every page, sending,
ending a conversation, the per-message eye toggle and Catch.

Views parse the request, call a service, commit, then answer: JSON for ``format=json``
(or a client that asks for JSON), else a redirect with a flash message. Guests chat from
the session cookie only; nothing of theirs reaches the database.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from flask import (
    Blueprint,
    Response,
    abort,
    current_app,
    flash,
    get_template_attribute,
    jsonify,
    redirect,
    render_template,
    request,
    session,
    stream_with_context,
    url_for,
)
from flask_login import current_user, login_required
from sqlalchemy import inspect as sa_inspect

from dashboard.errors import TITLES, problem, refusal_status, wants_json
from dashboard.extensions import db, login_manager
from dashboard.ids import parse_id
from dashboard.memory import get_embedder, recall_cut
from dashboard.orbitpilot import chat_memory, conversations, drew_on, marks, replies
from dashboard.orbitpilot.chat_memory import ChatMemory
from dashboard.orbitpilot.conversations import ChatError
from dashboard.orbitpilot.replies import Exchange
from dashboard.orbitpilot.responder import (
    DEFAULT_MEMORY_K,
    DEFAULT_RESPONDER,
    Reply,
    drew_on_summary,
    load_responder,
)
from dashboard.plans.web import request_plans
from dashboard.refusals import Refusal
from dashboard.sources import BLINKS, CHAT_HISTORY, DOCUMENTS, PROFILE, SAVED

bp = Blueprint("orbitpilot", __name__, url_prefix="/orbitpilot")
log = logging.getLogger(__name__)

# Settings read here, with their defaults (so they need no entry in dashboard/config.py):
#   ORBITPILOT_RESPONDER  dotted path of the responder (default: the built-in, offline one)
#   ORBITPILOT_MEMORY_K   memory chunks a reply may draw on (default 3; 0: none)
GUEST_SESSION_KEY = "orbitpilot.guest_chat"
GUEST_REFUSED = "Sign in to choose what OrbitPilot remembers and to save replies as Blinks."


def _responder():
    responder = load_responder(current_app.config.get("ORBITPILOT_RESPONDER",
                                                      DEFAULT_RESPONDER))
    # A responder with settings of its own is handed the app's (services read no app).
    configured = getattr(responder, "configured", None)
    return configured(current_app.config) if callable(configured) else responder


def _memory_k() -> int:
    try:
        return max(0, min(int(current_app.config.get("ORBITPILOT_MEMORY_K",
                                                     DEFAULT_MEMORY_K)), 10))
    except (TypeError, ValueError):
        return DEFAULT_MEMORY_K


def _json_requested() -> bool:
    return request.values.get("format") == "json" or wants_json()


def _problem(status: int, detail: str):
    return problem(status, TITLES.get(status, "Error"), detail)


def _refuse(error: Refusal):
    """A refused action (services refuse before they write): JSON for JSON clients, else
    the error page (never a 500)."""
    if _json_requested():
        return _problem(refusal_status(error), error.sentence)
    abort(refusal_status(error), error.sentence)


def _conversation_url(conversation_id: int | None, anchor: int | None = None) -> str:
    if conversation_id is None:
        return url_for("orbitpilot.chat")
    url = url_for("orbitpilot.conversation", conversation_id=conversation_id)
    return f"{url}#m{anchor}" if anchor else url


def _chat_memory() -> ChatMemory:
    return chat_memory.get_chat_memory(current_user, request_plans())


def team_memories_path(slug: str) -> str:
    """A team's memories page (the teams' pages serve it)."""
    return f"/teams/{slug}/memories"


def drew_on_links(item: drew_on.DrewOn) -> dict[str, Any]:
    """Where a "Drew on" item lives, and how to forget it: ``forget`` is a POST form's
    action and fields, or ``forget_page`` a page that asks first (saved memories and
    documents: a choice of how, or a deletion), or neither (the profile: edit it)."""
    key, id_ = item.source_key, item.source_id
    back = request.path
    if item.team is not None:
        # A team's memory lives on its team's memories page (the team's role decides
        # whether "forget" is at hand there).
        url = f"{team_memories_path(item.owner)}#memory-{id_}"
        return {"url": url, "forget_page": url if item.may_forget else None}
    if key == SAVED:
        return {"url": url_for("memories.detail", memory_id=id_),
                "forget_page": url_for("memories.forget", memory_id=id_)}
    if key == BLINKS:
        return {"url": url_for("blinks.edit", id=id_),
                "forget": (url_for("blinks.toggle_memory"),
                           {"blink_id": id_, "excluded": "1", "next": back})}
    if key == DOCUMENTS:
        return {"url": url_for("documents.view", id=id_),
                "forget_page": url_for("documents.delete", id=id_)}
    if key == CHAT_HISTORY and item.message_id is not None:
        conversation = id_.split(":", 1)[0]
        return {"url": url_for("orbitpilot.conversation", conversation_id=conversation)
                + f"#m{item.message_id}",
                "forget": (url_for("orbitpilot.orbitpilot_toggle_remember"),
                           {"message_id": item.message_id, "not_remembered": "1"})}
    if key == PROFILE:
        return {"url": url_for("profile.index")}
    return {}


@bp.record_once
def _register_labels(state: Any) -> None:
    # Globals, not context: the message macro is also rendered on its own (the JSON's html).
    state.app.jinja_env.globals.update(
        ORBITPILOT_NOT_REMEMBERED=conversations.NOT_REMEMBERED_LABEL,
        ORBITPILOT_REMEMBERED=conversations.REMEMBERED_LABEL,
        orbitpilot_drew_on_links=drew_on_links,
        orbitpilot_note_about=chat_memory.honesty_about,
    )


@bp.app_context_processor
def chat_template_helpers() -> dict[str, Any]:
    """The dock and the notice, as functions: a page pays for them only if it renders
    the dock (the notice: at most one query, none once the request read the plan)."""
    return {"orbitpilot_dock": _dock, "orbitpilot_chat_memory": _chat_memory,
            "ORBITPILOT_MAX_CHARS": replies.MAX_MESSAGE_CHARS}


def _current_user_id() -> int:
    # From the identity map key: after a commit the row is expired, and ``current_user.id``
    # would cost the dock a refresh query.
    state = sa_inspect(current_user._get_current_object(), raiseerr=False)
    if state is not None and state.identity:
        return state.identity[0]
    return current_user.id


def _dock() -> dict[str, Any] | None:
    if not current_user.is_authenticated:
        return None
    return {"state": conversations.dock_state(db.session, _current_user_id()),
            "memory": _chat_memory()}


# -- the full-screen chat ------------------------------------------------------------------

def _render_chat(*, conversation=None, messages=(), draft: str = "", error: str = "",
                 status: int = 200):
    memory = _chat_memory()
    guest = not current_user.is_authenticated
    listed = [] if guest else conversations.list_conversations(db.session, current_user.id)
    return render_template(
        "orbitpilot/chat.html", guest=guest, conversation=conversation,
        conversations=listed, messages=list(messages), memory=memory,
        draft=draft, error=error, max_chars=replies.MAX_MESSAGE_CHARS,
    ), status


@bp.route("/")
def chat():
    """Signed in: the latest open conversation (or a new one). Guest: the session's."""
    if not current_user.is_authenticated:
        return _render_chat(messages=replies.guest_turns(session.get(GUEST_SESSION_KEY)))
    session.pop(GUEST_SESSION_KEY, None)
    conversation = conversations.latest_open_conversation(db.session, current_user.id)
    if conversation is None:
        return _render_chat()
    return _render_chat(conversation=conversation,
                        messages=conversations.conversation_messages(db.session, conversation.id))


@bp.route("/new")
@login_required
def new_conversation():
    return _render_chat()


@bp.route("/c/<conversation_id>")
@login_required
def conversation(conversation_id: str):
    try:
        found = conversations.get_conversation(db.session, current_user.id, conversation_id)
    except Refusal as exc:
        return _refuse(exc)
    return _render_chat(conversation=found,
                        messages=conversations.conversation_messages(db.session, found.id))


@bp.route("/c/<conversation_id>/end", methods=["POST"])
@bp.route("/end", methods=["POST"])  # the same, naming the conversation in the form
@login_required
def end(conversation_id: str | None = None):
    if conversation_id is None:
        conversation_id = request.form.get("conversation_id", "")
    try:
        build = conversations.end_user_conversation(db.session, user_id=current_user.id,
                                               conversation_id=conversation_id)
    except Refusal as exc:
        return _refuse(exc)
    db.session.commit()
    id_ = parse_id(conversation_id)
    if _json_requested():
        return jsonify(conversation_id=id_, status="ended",
                       build_requested=build is not None)
    flash("Conversation ended. OrbitPilot will update your memory in a moment."
          if build is not None else "That conversation had already ended.", "success")
    return redirect(_conversation_url(id_), 303)


@bp.route("/guest/clear", methods=["POST"])
def clear_guest():
    """A guest's "start over": the session forgets the conversation."""
    session.pop(GUEST_SESSION_KEY, None)
    return redirect(url_for("orbitpilot.chat"), 303)


# -- sending -------------------------------------------------------------------------------

def _exchange_json(exchange: Exchange, memory: ChatMemory, *, guest: bool) -> dict[str, Any]:
    note = memory.honesty_note
    bubble = get_template_attribute("orbitpilot/_macros.html", "message")
    html = "".join(str(bubble(m, note=note, guest=guest))
                   for m in (exchange.question, exchange.reply))
    reply = {**exchange.reply.to_dict(), "honesty_note": note}
    return {
        "conversation_id": exchange.conversation_id,
        "conversation_url": _conversation_url(exchange.conversation_id),
        "conversation_title": exchange.conversation_title,
        "new_conversation": exchange.new_conversation,
        "message": exchange.question.to_dict(),
        "reply": reply,
        "honesty_note": note,
        "drew_on": {**exchange.drew_on,
                    "items": [{**item.to_dict(), "url": drew_on_links(item).get("url")}
                              for item in exchange.reply.drew_on]},
        "message_ids": [exchange.question.id, exchange.reply.id],
        "html": html,
    }


@bp.route("/send", methods=["POST"])
def send():
    text = request.form.get("message", "")
    if not current_user.is_authenticated:
        return _guest_send(text)
    conversation_id = request.form.get("conversation_id") or None
    embedder = get_embedder(current_app.config["EMBEDDER"]) if _memory_k() else None
    send = {"user_id": current_user.id, "text": text, "conversation_id": conversation_id,
            "embedder": embedder, "memory_k": _memory_k(),
            "max_distance": recall_cut(current_app.config["RECALL_MAX_DISTANCE"])}
    if _stream_requested():
        return _send_streamed(send)
    try:
        exchange = replies.send_message(db.session, responder=_responder(), **send)
    except Refusal as exc:
        return _send_refused(exc, text, conversation_id)
    memory = _chat_memory()
    payload = _exchange_json(exchange, memory, guest=False) if _json_requested() else None
    db.session.commit()
    if payload is not None:
        return jsonify(payload), 201
    return redirect(_conversation_url(exchange.conversation_id, exchange.reply.id), 303)


def _stream_requested() -> bool:
    return request.accept_mimetypes.best == "text/event-stream"


def _event(name: str, data: dict[str, Any]) -> str:
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


def _send_streamed(send: dict[str, Any]):
    """The reply as server-sent events while the responder writes it: ``delta`` events
    with its text, then ``done`` with what the JSON answer holds (both messages stored),
    or ``error`` with the problem (the question rolled back). A send refused before any
    of it (an empty message, someone else's or an ended conversation) is the JSON
    problem, as without streaming. All writes happen in the stream, in one transaction:
    the request's own ends when the response starts."""
    try:
        replies.check_send(db.session, user_id=send["user_id"], text=send["text"],
                            conversation_id=send["conversation_id"])
    except Refusal as exc:
        return _problem(refusal_status(exc), exc.sentence)
    # Read now: in the stream the request's session may be gone, its rows with it.
    memory = _chat_memory()
    responder = _responder()
    db.session.rollback()  # the check wrote nothing; the stream starts afresh

    def events():
        pending = None
        try:
            pending = replies.begin_send(db.session, **send)
            pieces: list[str] = []
            for piece in replies.stream_reply(responder, pending.context):
                pieces.append(piece)
                yield _event("delta", {"text": piece})
            reply = Reply("".join(pieces).strip(), drew_on_summary(pending.context))
            exchange = replies.finish_send(db.session, pending, reply)
            payload = _exchange_json(exchange, memory, guest=False)
            db.session.commit()
        except Refusal as exc:
            _abandon(pending)
            yield _event("error", {"status": refusal_status(exc), "detail": exc.sentence})
            return
        except Exception as exc:  # the status line is sent already: say it in an event
            log.warning("a streamed reply failed: %s", type(exc).__name__)
            _abandon(pending)
            yield _event("error", {"status": 500, "detail": replies.NO_ANSWER})
            return
        yield _event("done", payload)

    response = Response(stream_with_context(events()), mimetype="text/event-stream")
    response.headers["Cache-Control"] = "no-store"
    response.headers["X-Accel-Buffering"] = "no"  # a proxy in front passes each event on
    return response


def _abandon(pending: replies.PendingReply | None) -> None:
    if pending is not None:
        replies.abandon_send(pending)
    db.session.rollback()


def _send_refused(error: Refusal, draft: str, conversation_id: Any):
    """JSON: the problem. A form: the chat again, with the error and the draft kept."""
    status = refusal_status(error)
    if _json_requested():
        return _problem(status, error.sentence)
    if status == 404:
        abort(404, error.sentence)
    found, messages = None, []
    if conversation_id is not None and current_user.is_authenticated:
        try:
            found = conversations.get_conversation(db.session, current_user.id, conversation_id)
            messages = conversations.conversation_messages(db.session, found.id)
        except Refusal:
            found = None
    return _render_chat(conversation=found, messages=messages, draft=draft[:20_000],
                        error=error.sentence, status=status)


def _guest_send(text: str):
    try:
        exchange, kept = replies.guest_send(session.get(GUEST_SESSION_KEY), text,
                                             responder=_responder())
    except Refusal as exc:
        if _json_requested():
            return _problem(refusal_status(exc), exc.sentence)
        return _render_chat(messages=replies.guest_turns(session.get(GUEST_SESSION_KEY)),
                            draft=text[:20_000], error=exc.sentence,
                            status=refusal_status(exc))
    session[GUEST_SESSION_KEY] = kept
    if _json_requested():
        return jsonify(_exchange_json(exchange, chat_memory.GUEST_CHAT_MEMORY, guest=True)), 201
    return redirect(url_for("orbitpilot.chat"), 303)


# -- actions on one message: the eye toggle and Catch ---------------------------------

def _guest_refused():
    """Guests have no stored messages: 401 for JSON, the sign-in page for a form."""
    if _json_requested():
        return _problem(401, GUEST_REFUSED)
    return login_manager.unauthorized()


@bp.route("/message/remember/", methods=["POST"])
def orbitpilot_toggle_remember():
    """Flip "do not remember" on one of the user's own messages."""
    if not current_user.is_authenticated:
        return _guest_refused()
    wanted = request.form.get("not_remembered")
    if wanted not in (None, "0", "1"):
        return _refuse(ChatError("“not_remembered” must be 1 or 0 when given."))
    try:
        result = marks.toggle_remember(
            db.session, user=current_user, message_id=request.form.get("message_id"),
            not_remembered=None if wanted is None else wanted == "1")
    except Refusal as exc:
        return _refuse(exc)
    db.session.commit()
    if _json_requested():
        return jsonify(message_id=result.message_id, not_remembered=result.not_remembered,
                       label=result.label)
    flash("OrbitPilot will not remember this message from your next memory update. It "
          "still follows this conversation." if result.not_remembered else
          "OrbitPilot will remember this message again from your next memory update.",
          "success")
    return redirect(_conversation_url(result.conversation_id, result.message_id), 303)


@bp.route("/message/catch/", methods=["POST"])
def orbitpilot_catch():
    """Catch: save one of OrbitPilot's replies as a Blink."""
    if not current_user.is_authenticated:
        return _guest_refused()
    try:
        result = marks.catch_reply(db.session, user_id=current_user.id,
                                      message_id=request.form.get("message_id"))
    except Refusal as exc:
        return _refuse(exc)
    db.session.commit()
    if _json_requested():
        return jsonify(message_id=result.message_id, blink_id=result.blink_id,
                       title=result.title, label="Saved as a Blink",
                       blink_url=url_for("blinks.edit", id=result.blink_id)), 201
    flash("Caught: the reply is saved as a Blink.", "success")
    return redirect(_conversation_url(result.conversation_id, result.message_id), 303)


@bp.route("/drew-on/not-relevant/", methods=["POST"])
def not_relevant():
    """One item under a reply did not bear on it: it leaves that reply's "Drew on"."""
    if not current_user.is_authenticated:
        return _guest_refused()
    try:
        result = marks.mark_not_relevant(db.session, user_id=current_user.id,
                                            recall_id=request.form.get("recall_id"))
    except Refusal as exc:
        return _refuse(exc)
    db.session.commit()
    if _json_requested():
        return jsonify(recall_id=result.recall_id, not_relevant=True)
    flash("Marked not relevant: it is no longer listed under that reply.", "success")
    return redirect(_conversation_url(result.conversation_id, result.message_id), 303)
