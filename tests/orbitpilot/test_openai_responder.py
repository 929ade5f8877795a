"""The OpenAI-compatible responder against a real local server speaking the protocol (SSE
over chunked HTTP): what it sends, what the user gets, and every failure a refusal."""

from __future__ import annotations

import json
import logging
import socket
import threading
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from sqlalchemy import func, select

from dashboard.config import SettingError, settings_from_env
from dashboard.extensions import db
from dashboard.memory import POSSIBLY_RELATED
from dashboard.orbitpilot import chat_memory, replies
from dashboard.orbitpilot.models import Message
from dashboard.orbitpilot.openai_responder import (
    DEFAULT_TIMEOUT,
    FLAGGED_TURNS,
    UNSURE_ITEMS,
    OpenAIResponder,
    OpenAIResponderError,
    build_messages,
    chat_completion_pieces,
    current_settings,
    stream_pieces,
    system_prompt,
)
from dashboard.orbitpilot.responder import (
    NOTHING_RELEVANT,
    BuiltinResponder,
    MemoryHit,
    ResponderContext,
    Turn,
    load_responder,
)
from dashboard.security import get_limiter
from dashboard.sources import CHAT_HISTORY, SAVED, get_source
from tests.conftest import AuthActions, csrf_from
from tests.factories import build, make_memory, make_plan, make_user, plans_of
from tests.orbitpilot.conftest import CHAT_PAGE, SEND, TOGGLE, send, token
from tests.orbitpilot.dom import parse
from tests.workers import run_worker

# Split over several events, with a character outside ASCII; it shares no content word with
# any question below, so a pair it answers is recalled for its question only.
ANSWER_PIECES = ["Here is ", "what I ", "found — ", "voilà", "."]
ANSWER = "".join(ANSWER_PIECES)
MODEL = "orbit-test-model"


def parse_stream(lines) -> str:
    """The whole answer of a stream (``stream_pieces`` joined)."""
    return "".join(stream_pieces(lines)).strip()


def stream_chat_completion(url: str, messages: list[dict[str, str]], *, model: str,
                           api_key: str | None = None, timeout: float = DEFAULT_TIMEOUT) -> str:
    """The whole answer (``chat_completion_pieces`` joined)."""
    return "".join(chat_completion_pieces(url, messages, model=model, api_key=api_key,
                                          timeout=timeout)).strip()


# -- a server speaking the protocol ------------------------------------------------------------

@dataclass
class Recorded:
    path: str
    headers: dict[str, str]
    body: dict

    @property
    def system(self) -> str:
        first = self.body["messages"][0]
        assert first["role"] == "system"
        return first["content"]

    @property
    def turns(self) -> list[dict]:
        return self.body["messages"][1:]


def sse(payload) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload)
    return f"data: {data}\n\n".encode()


def delta(content=None, finish=None) -> dict:
    return {"id": "c1", "object": "chat.completion.chunk", "model": MODEL,
            "choices": [{"index": 0, "finish_reason": finish,
                         "delta": {} if content is None else {"content": content}}]}


def stream_of(pieces: list[str]) -> bytes:
    """An answer as the servers stream it: a keep-alive comment, a role-only first chunk,
    the pieces, an empty chunk with the finish reason, then [DONE]."""
    first = delta("")
    first["choices"][0]["delta"]["role"] = "assistant"
    return b"".join([b": keep-alive\n\n", sse(first), *(sse(delta(p)) for p in pieces),
                     sse(delta(finish="stop")), sse("[DONE]")])


@dataclass
class FakeServer:
    """``mode``: "stream" (``pieces``), "500", "redirect", "malformed", "empty",
    "truncated" or "stall" (no answer until the test ends)."""

    httpd: ThreadingHTTPServer
    requests: list[Recorded] = field(default_factory=list)
    mode: str = "stream"
    pieces: list[str] = field(default_factory=lambda: list(ANSWER_PIECES))
    released: threading.Event = field(default_factory=threading.Event)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def wire(self) -> bytes:
        if self.mode == "malformed":
            return sse(delta("Half")) + b'data: {"choices": [\n\n' + sse("[DONE]")
        if self.mode == "empty":
            return stream_of(["", "  "])
        if self.mode == "truncated":  # the connection ends mid-answer
            return sse(delta("Cut ")) + sse(delta("short"))
        return stream_of(self.pieces)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # chunked transfer, as vLLM, Ollama and OpenAI answer

    def do_POST(self):
        fake: FakeServer = self.server.fake
        length = int(self.headers.get("Content-Length", 0))
        body = json.loads(self.rfile.read(length)) if length else {}
        fake.requests.append(Recorded(self.path, {k.lower(): v for k, v in
                                                  self.headers.items()}, body))
        if self.path != "/v1/chat/completions":
            return self._plain(404, b'{"error": "not found"}')
        if fake.mode == "500":
            return self._plain(500, b'{"error": {"message": "model crashed"}}')
        if fake.mode == "redirect":  # followed, it would take the key along
            self.send_response(303)
            self.send_header("Location", "/v1/elsewhere")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        if fake.mode == "stall":
            fake.released.wait(30)
            return self._plain(503, b"{}")
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()
        wire = fake.wire()
        # Transfer chunks of 7 bytes: lines, JSON and the UTF-8 of "—" and "à" split across.
        for start in range(0, len(wire), 7):
            piece = wire[start:start + 7]
            self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        self.close_connection = True

    do_GET = do_POST  # recorded too: a redirect followed would show here as a GET

    def _plain(self, status: int, body: bytes):
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args):  # noqa: A002 - the base class's signature
        pass


@pytest.fixture
def openai_server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    # A stalled answer's client is gone when it is released: no traceback for that.
    httpd.handle_error = lambda request, client_address: None
    fake = FakeServer(httpd)
    httpd.fake = fake
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield fake
    fake.released.set()
    httpd.shutdown()
    httpd.server_close()
    thread.join(10)


@pytest.fixture
def use_openai(app, monkeypatch, openai_server):
    """The chat answers through the ``openai`` responder, pointed at the test server
    (monkeypatch puts the app's config back after the test)."""
    settings = {"ORBITPILOT_RESPONDER": "openai",
                "ORBITPILOT_OPENAI_BASE_URL": openai_server.base_url,
                "ORBITPILOT_OPENAI_MODEL": MODEL, "ORBITPILOT_OPENAI_API_KEY": None,
                "ORBITPILOT_OPENAI_TIMEOUT": 10.0}
    for name, value in settings.items():
        monkeypatch.setitem(app.config, name, value)
    return openai_server


def closed_port_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def message_count(session, user_id: int) -> int:
    return session.scalar(select(func.count()).select_from(Message)
                          .where(Message.user_id == user_id))


# -- the stream, the messages and the settings, on their own --------------------------------

def test_the_stream_is_the_deltas_joined_up_to_done():
    lines = [b": ping\n", b"\n", b"event: message\n", *stream_of(["Hel", "lo", " there"])
             .splitlines(keepends=True), b"data: not json, after [DONE]: never read\n", b"\n"]
    assert parse_stream(lines) == "Hello there"


def test_an_event_of_several_data_lines_is_one_json_document():
    lines = ['data: {"choices": [{"delta":\n',
             'data: {"content": "Hi"}, "finish_reason": null}]}\n', "\n", "data:[DONE]\n", "\n"]
    assert parse_stream(lines) == "Hi"


def test_a_finish_reason_ends_a_stream_that_sends_no_done():
    assert parse_stream((sse(delta("Done.")) + sse(delta(finish="stop"))).splitlines(True)) \
        == "Done."


@pytest.mark.parametrize("wire", [
    sse(delta("Cut ")) + sse(delta("short")),                      # ended mid-answer
    sse(delta("Half")) + b'data: {"choices": [\n\n' + sse("[DONE]"),  # malformed JSON
    sse({"error": {"message": "overloaded"}}) + sse("[DONE]"),     # an error event
    sse({"object": "chat.completion.chunk"}) + sse("[DONE]"),      # no choices
    sse(delta(["not", "text"])) + sse("[DONE]"),                   # content not a string
    stream_of(["", "  \n "]),                                      # an empty answer
    b"",                                                           # nothing at all
], ids=["truncated", "malformed", "error-event", "no-choices", "non-text", "empty", "nothing"])
def test_a_stream_that_is_not_a_whole_answer_raises(wire):
    with pytest.raises(OpenAIResponderError):
        parse_stream(wire.splitlines(keepends=True))


def test_the_messages_are_the_system_with_the_memory_then_every_turn():
    hits = (MemoryHit(SAVED, "Saved memories", "7", "Prefers trains\nover planes", 0.2),
            MemoryHit(CHAT_HISTORY, "Chat history", "3:0", "user: Porto?", 0.3))
    context = ResponderContext((Turn("user", "hi", 1), Turn("assistant", "hello", 2),
                                Turn("user", "secret", 3, not_remembered=True),
                                Turn("assistant", "ok", 4), Turn("user", "trains?", 5)),
                               hits)
    messages = build_messages(context)
    system = messages[0]["content"]
    assert messages[0]["role"] == "system" and "OrbitPilot" in system
    assert "- Saved memories: Prefers trains over planes" in system.splitlines()
    assert "- Chat history: user: Porto?" in system.splitlines()
    assert "only when they are relevant" in system
    # The "Not remembered" turn too: the chat still follows it.
    assert messages[1:] == [{"role": t.role, "content": t.content} for t in context.turns]
    # ... and the model is asked never to repeat it (its reply will be remembered).
    assert FLAGGED_TURNS in system.splitlines()
    bare = build_messages(ResponderContext((Turn("user", "hi"),), (), guest=True))[0]
    assert "Nothing was recalled" in bare["content"] and "signed out" in bare["content"]
    assert FLAGGED_TURNS not in bare["content"]
    assert UNSURE_ITEMS not in system


def test_a_possibly_related_item_is_marked_for_the_model():
    hits = (MemoryHit(SAVED, "Saved memories", "7", "Prefers trains", 0.2),
            MemoryHit(SAVED, "Saved memories", "8", "Likes Porto", 0.6,
                      relevance=POSSIBLY_RELATED))
    lines = system_prompt(hits).splitlines()
    assert "- Saved memories: Prefers trains" in lines
    assert "- Saved memories (possibly related): Likes Porto" in lines
    assert UNSURE_ITEMS in lines


def test_the_aliases_name_the_builtin_and_the_openai_responders():
    assert isinstance(load_responder("openai"), OpenAIResponder)
    assert isinstance(load_responder("builtin"), BuiltinResponder)
    with pytest.raises(ValueError, match="openai"):
        load_responder("nonsense")


def test_the_settings_are_read_by_the_config_and_handed_over(monkeypatch, tmp_path):
    monkeypatch.setenv("ORBITPILOT_OPENAI_BASE_URL", " http://127.0.0.1:11434/v1/")
    monkeypatch.setenv("ORBITPILOT_OPENAI_MODEL", "llama3")
    monkeypatch.setenv("ORBITPILOT_OPENAI_TIMEOUT", "12.5")
    monkeypatch.setenv("ORBITPILOT_OPENAI_API_KEY", "  ")
    config = settings_from_env(tmp_path)
    settings = current_settings(config)
    assert settings.url == "http://127.0.0.1:11434/v1/chat/completions"
    assert (settings.model, settings.api_key, settings.timeout) == ("llama3", None, 12.5)
    # The responder reads no environment: what it is not handed, it does not have.
    with pytest.raises(OpenAIResponderError):
        current_settings({**config, "ORBITPILOT_OPENAI_MODEL": None})
    with pytest.raises(OpenAIResponderError):
        current_settings(None)


@pytest.mark.parametrize(("name", "value"), [
    ("TIMEOUT", "0"), ("TIMEOUT", "-3"), ("TIMEOUT", "soon"), ("TIMEOUT", "inf"),
    ("BASE_URL", "127.0.0.1:11434/v1"), ("BASE_URL", "ftp://models.example/v1"),
])
def test_a_bad_openai_setting_stops_the_start(monkeypatch, tmp_path, name, value):
    monkeypatch.setenv(f"ORBITPILOT_OPENAI_{name}", value)
    with pytest.raises(SettingError, match=f"^ORBITPILOT_OPENAI_{name}: "):
        settings_from_env(tmp_path)


def test_the_stream_function_posts_and_reads_a_chunked_stream(openai_server):
    openai_server.pieces = ["Only ", "this", "."]
    answer = stream_chat_completion(openai_server.base_url + "/chat/completions",
                                    [{"role": "user", "content": "hi"}], model="m",
                                    api_key="k-1", timeout=10)
    assert answer == "Only this."
    (request,) = openai_server.requests
    assert request.body == {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                            "stream": True}
    assert request.headers["authorization"] == "Bearer k-1"
    assert request.headers["content-type"] == "application/json"


# -- (a) the recalled memory reaches the server; the streamed answer reaches the user ------

@pytest.mark.processes
def test_a_saved_memory_built_by_a_worker_is_in_the_request_and_the_answer_is_the_reply(
        app, committed, queue, use_openai):
    user = committed.user()
    preference = f"I prefer aisle seats on night trains ({uuid.uuid4().hex})"
    make_memory(committed.session, user, preference)
    committed.session.commit()
    run_worker(app)  # a real worker process runs the build the save requested

    with app.app_context():
        get_limiter(app).reset()
    chat = app.test_client()
    assert AuthActions(chat).login(user.email).status_code == 302
    question = "Which seats should you book on trains?"  # shares "trains" and "seats"
    response = chat.post(SEND, data={"message": question, "format": "json",
                                     "csrf_token": csrf_from(chat, CHAT_PAGE)})
    assert response.status_code == 201, response.get_data(as_text=True)
    body = response.get_json()

    (request,) = use_openai.requests
    label = get_source(SAVED).label
    assert f"- {label}: {preference}" in request.system.splitlines()
    assert request.turns == [{"role": "user", "content": question}]
    assert body["reply"]["content"] == ANSWER
    # The responder's part of "drew_on" (the chat may add more keys of its own).
    assert {key: body["drew_on"][key] for key in ("earlier_turns", "sources", "memory_items")} \
        == {"earlier_turns": 0, "sources": [label], "memory_items": 1}
    with app.app_context():
        assert db.session.get(Message, body["reply"]["id"]).content == ANSWER
        db.session.remove()


# -- (b) a message flagged "do not remember" never reaches memory after the next build -----

def ask(client, text: str, conversation_id=None) -> dict:
    response = send(client, text, conversation_id)
    assert response.status_code == 201, response.get_data(as_text=True)
    return response.get_json()


def test_a_flagged_message_is_not_in_the_memory_sent_after_the_next_build(
        client, signed_in, db_session, use_openai):
    secret = "My pineapple locker code is 4471-zx"
    control = "I bake pineapple tarts on Sundays"
    flagged = ask(client, secret)
    ask(client, control)
    build(db_session, signed_in)

    # Before the flag: the secret is recalled for a question sharing its word.
    ask(client, "pineapple?")
    assert secret in use_openai.requests[-1].system

    response = client.post(TOGGLE, data={"message_id": str(flagged["message"]["id"]),
                                         "not_remembered": "1", "format": "json",
                                         "csrf_token": token(client)})
    assert response.status_code == 200 and response.get_json()["not_remembered"] is True
    build(db_session, signed_in)

    ask(client, "pineapple?")
    later = use_openai.requests[-1]
    assert control in later.system  # recall still works: the other pair is there
    assert secret not in later.system and "4471" not in later.system
    # In its own conversation the turn is still followed, but not recalled as memory.
    ask(client, "pineapple again?", flagged["conversation_id"])
    same = use_openai.requests[-1]
    assert "4471" not in same.system
    assert {"role": "user", "content": secret} in same.turns


# -- (c) the honesty note -----------------------------------------------------------------

def test_the_honesty_note_comes_with_the_reply_when_chat_is_not_remembered(
        client, auth, db_session, use_openai):
    user = make_user(db_session, plan=make_plan(db_session, cap=4,
                                                assignments={CHAT_HISTORY: False}))
    expected = chat_memory.get_chat_memory(user, plans_of(db_session)).honesty_note
    assert expected  # this plan does not remember chat history
    auth.login(user.email)
    body = ask(client, "Will you remember this?")
    assert len(use_openai.requests) == 1
    assert body["reply"]["content"] == ANSWER
    assert body["honesty_note"] == expected == body["reply"]["honesty_note"]
    assert [n.text for n in parse(body["html"]).find_all(data_op_honesty_text=True)] == \
        [expected]
    page = parse(client.get(f"/orbitpilot/c/{body['conversation_id']}").get_data(as_text=True))
    assert [n.text for n in page.find_all(data_op_honesty_text=True)] == [expected]


def test_no_honesty_note_when_chat_is_remembered(client, signed_in, use_openai):
    body = ask(client, "Will you remember this?")
    assert body["reply"]["content"] == ANSWER
    assert body["honesty_note"] is None and body["reply"]["honesty_note"] is None


# -- (d) the model and the key --------------------------------------------------------------

def test_the_model_and_the_bearer_key_are_sent(app, client, signed_in, monkeypatch,
                                               use_openai):
    first = ask(client, "hello there")
    ask(client, "and again", first["conversation_id"])
    monkeypatch.setitem(app.config, "ORBITPILOT_OPENAI_API_KEY", "sk-test-4242")
    monkeypatch.setitem(app.config, "ORBITPILOT_OPENAI_MODEL", "another-model")
    ask(client, "with a key", first["conversation_id"])

    without, _, keyed = use_openai.requests
    assert without.path == keyed.path == "/v1/chat/completions"
    assert "authorization" not in without.headers
    assert (without.body["model"], without.body["stream"]) == (MODEL, True)
    assert keyed.headers["authorization"] == "Bearer sk-test-4242"
    assert keyed.body["model"] == "another-model"
    assert keyed.turns == [{"role": "user", "content": "hello there"},
                           {"role": "assistant", "content": ANSWER},
                           {"role": "user", "content": "and again"},
                           {"role": "assistant", "content": ANSWER},
                           {"role": "user", "content": "with a key"}]


# -- (e) failures: the "could not answer" refusal, never a 500 -------------------------------

@pytest.mark.parametrize("failure", ["500", "closed-port", "redirect", "malformed", "empty",
                                     "truncated", "stall"])
def test_a_failing_server_is_the_could_not_answer_refusal(app, client, signed_in, db_session,
                                                          monkeypatch, caplog, use_openai,
                                                          failure):
    monkeypatch.setitem(app.config, "ORBITPILOT_OPENAI_API_KEY", "sk-never-logged")
    if failure == "closed-port":
        monkeypatch.setitem(app.config, "ORBITPILOT_OPENAI_BASE_URL", closed_port_url())
    elif failure == "stall":
        use_openai.mode = "stall"
        monkeypatch.setitem(app.config, "ORBITPILOT_OPENAI_TIMEOUT", 0.3)
    else:
        use_openai.mode = failure
    caplog.set_level(logging.DEBUG)
    response = send(client, "Where is the xyzzy-ledger kept?")
    assert response.status_code == 502
    assert response.get_json()["detail"] == replies.NO_ANSWER
    assert message_count(db_session, signed_in.id) == 0
    assert len(use_openai.requests) == (0 if failure == "closed-port" else 1)
    assert "xyzzy" not in caplog.text and "sk-never-logged" not in caplog.text
    assert "responder failed" in caplog.text


def test_a_missing_setting_is_the_refusal_too(app, client, signed_in, monkeypatch,
                                              use_openai):
    monkeypatch.setitem(app.config, "ORBITPILOT_OPENAI_BASE_URL", None)
    response = send(client, "hello?")
    assert response.status_code == 502
    assert response.get_json()["detail"] == replies.NO_ANSWER
    assert use_openai.requests == []


# -- guests --------------------------------------------------------------------------------

def test_a_guest_is_answered_from_the_session_with_no_memory(client, use_openai):
    first = ask(client, "hello as a guest")
    ask(client, "and again")
    assert first["reply"]["content"] == ANSWER
    request = use_openai.requests[-1]
    assert "signed out" in request.system and "Nothing was recalled" in request.system
    assert [t["content"] for t in request.turns] == ["hello as a guest", ANSWER, "and again"]


# -- streamed to the browser ------------------------------------------------------------------

def streamed(client, text: str, conversation_id=None):
    """A send asking for the reply as server-sent events; the response and its events."""
    data = {"message": text, "csrf_token": token(client)}
    if conversation_id is not None:
        data["conversation_id"] = str(conversation_id)
    response = client.post(SEND, data=data, headers={"Accept": "text/event-stream"})
    events = []
    if response.mimetype == "text/event-stream":
        for raw in response.get_data(as_text=True).split("\n\n"):
            if raw.strip():
                name = next(line[7:] for line in raw.splitlines() if line.startswith("event: "))
                data_line = next(line[6:] for line in raw.splitlines()
                                 if line.startswith("data: "))
                events.append((name, json.loads(data_line)))
    return response, events


def test_the_reply_is_streamed_piece_by_piece_then_stored(client, signed_in, db_session,
                                                          use_openai):
    response, events = streamed(client, "What did you find?")
    assert response.status_code == 200 and response.mimetype == "text/event-stream"
    assert response.headers["Cache-Control"] == "no-store"
    names = [name for name, _ in events]
    assert names == ["delta"] * len(ANSWER_PIECES) + ["done"]
    assert [data["text"] for name, data in events if name == "delta"] == ANSWER_PIECES
    done = events[-1][1]
    assert done["reply"]["content"] == ANSWER
    # The same answer a JSON send gets, and both turns stored.
    plain = send(client, "And again?", done["conversation_id"]).get_json()
    assert set(done) == set(plain)
    stored = db_session.scalars(select(Message.content).where(
        Message.conversation_id == done["conversation_id"]).order_by(Message.position)).all()
    assert stored == ["What did you find?", ANSWER, "And again?", ANSWER]


def test_the_builtin_reply_streams_too(client, signed_in, db_session):
    response, events = streamed(client, "Hello there")
    assert [name for name, _ in events][-1] == "done"
    text = "".join(data["text"] for name, data in events if name == "delta").strip()
    assert text == events[-1][1]["reply"]["content"] and text == NOTHING_RELEVANT
    assert message_count(db_session, signed_in.id) == 2


def test_a_stream_cut_off_midway_is_an_error_event_and_stores_nothing(
        client, signed_in, db_session, use_openai):
    use_openai.mode = "truncated"
    response, events = streamed(client, "Where is the ledger?")
    assert response.status_code == 200
    assert events[-1] == ("error", {"status": 502, "detail": replies.NO_ANSWER})
    assert {name for name, _ in events[:-1]} <= {"delta"}
    assert message_count(db_session, signed_in.id) == 0


def test_a_send_refused_before_streaming_is_the_problem_as_ever(client, signed_in, db_session,
                                                                use_openai):
    empty, _ = streamed(client, "   ")
    assert empty.status_code == 400 and empty.mimetype == "application/problem+json"
    _, events = streamed(client, "first")
    conversation = events[-1][1]["conversation_id"]
    ended = client.post(f"/orbitpilot/c/{conversation}/end",
                        data={"csrf_token": token(client), "format": "json"})
    assert ended.status_code == 200
    refused, _ = streamed(client, "after the end", conversation)
    assert refused.status_code == 409
    assert message_count(db_session, signed_in.id) == 2
    assert len(use_openai.requests) == 1
