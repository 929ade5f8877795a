"""A responder that asks any OpenAI-compatible ``/v1/chat/completions`` server (vLLM,
Ollama, llama.cpp, OpenAI) and streams its answer. ``ORBITPILOT_RESPONDER=openai`` picks
it; the ``ORBITPILOT_OPENAI_*`` settings say where and which model."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from dashboard.memory import RELEVANT
from dashboard.orbitpilot.responder import MemoryHit, Reply, ResponderContext, drew_on_summary

DEFAULT_TIMEOUT = 30.0
# A runaway stream is cut off (an exception) rather than stored.
MAX_STREAM_BYTES = 2_000_000
DONE = "[DONE]"


class OpenAIResponderError(RuntimeError):
    """The server gave no usable answer. Messages name what went wrong, never content."""


@dataclass(frozen=True)
class OpenAISettings:
    base_url: str
    model: str
    api_key: str | None = None
    timeout: float = DEFAULT_TIMEOUT

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + "/chat/completions"


def current_settings(config: Mapping[str, Any] | None) -> OpenAISettings:
    """The settings out of ``config``: the app's (``dashboard.config`` read and checked
    them at start), which the chat's edge hands over. None, or no server or model named:
    no answer (the chat's refused reply)."""
    if config is None:
        raise OpenAIResponderError("no settings were handed to the responder")
    base_url = (config.get("ORBITPILOT_OPENAI_BASE_URL") or "").strip()
    model = (config.get("ORBITPILOT_OPENAI_MODEL") or "").strip()
    if not base_url or not model:
        raise OpenAIResponderError("ORBITPILOT_OPENAI_BASE_URL and ORBITPILOT_OPENAI_MODEL "
                                   "must both be set")
    timeout = config.get("ORBITPILOT_OPENAI_TIMEOUT") or DEFAULT_TIMEOUT
    if timeout <= 0:
        raise OpenAIResponderError("ORBITPILOT_OPENAI_TIMEOUT must be positive")
    return OpenAISettings(base_url, model, config.get("ORBITPILOT_OPENAI_API_KEY") or None,
                          float(timeout))


# -- what is sent ----------------------------------------------------------------------------

def _one_line(text: str) -> str:
    return " ".join(text.split())


# A reply is remembered with its question, so a flagged turn repeated in a later reply
# would outlive its flag: the model is asked not to (a request, not a guarantee).
FLAGGED_TURNS = ("The person asked that some of their messages in this conversation not be "
                 "remembered. Follow them in this conversation, but never repeat or quote "
                 "them in your replies.")


UNSURE_ITEMS = ("An item marked (possibly related) may not be about the message: if you use "
                "it, say that you are not sure.")


def _source(hit: MemoryHit) -> str:
    source = hit.label if hit.team is None else f"{hit.label} of the team {hit.team}"
    return source if hit.relevance == RELEVANT else f"{source} (possibly related)"


def system_prompt(memory: tuple[MemoryHit, ...], *, guest: bool = False,
                  flagged: bool = False) -> str:
    """Who the model is, and the recalled memory items, one line each."""
    lines = ["You are OrbitPilot, the assistant of the OrbitPilot Memory Dashboard.",
             # What is remembered is the person's plan and flags, never the model's promise.
             "Never promise to remember or forget anything."]
    if guest:
        lines.append("The person is signed out: you know nothing of them beyond this "
                     "conversation.")
    if memory:
        lines.append("Items recalled from the person's memory and their teams' for this "
                     "message (source: content). Use them only when they are relevant to "
                     "the message; otherwise ignore them. When you use a team's item, say "
                     "which team's memory it comes from:")
        lines.extend(f"- {_one_line(_source(hit))}: {_one_line(hit.content)}"
                     for hit in memory)
        if any(hit.relevance != RELEVANT for hit in memory):
            lines.append(UNSURE_ITEMS)
    else:
        lines.append("Nothing was recalled from the person's memory for this message.")
    if flagged:
        lines.append(FLAGGED_TURNS)
    return "\n".join(lines)


def build_messages(context: ResponderContext) -> list[dict[str, str]]:
    """The system message, then every turn of the conversation in order (those marked
    "Not remembered" too: the chat still follows them)."""
    flagged = any(turn.not_remembered for turn in context.turns)
    messages = [{"role": "system", "content": system_prompt(context.memory, guest=context.guest,
                                                            flagged=flagged)}]
    messages.extend({"role": turn.role, "content": turn.content} for turn in context.turns)
    return messages


# -- the stream ------------------------------------------------------------------------------

def sse_events(lines: Iterable[bytes | str]) -> Iterator[str]:
    """The ``data`` of each server-sent event (several ``data:`` lines join with a newline;
    comments and other fields are skipped)."""
    data: list[str] = []
    for raw in lines:
        line = (raw.decode("utf-8") if isinstance(raw, bytes) else raw).rstrip("\r\n")
        if not line:
            if data:
                yield "\n".join(data)
                data = []
            continue
        field_name, _, value = line.partition(":")
        if field_name == "data":
            data.append(value[1:] if value.startswith(" ") else value)
    if data:  # a last event without its blank line: a truncated one fails to parse below
        yield "\n".join(data)


def _delta_content(chunk: Any) -> tuple[str, bool]:
    """A chunk's text and whether it says the answer is finished."""
    if not isinstance(chunk, dict):
        raise OpenAIResponderError("a stream event is not a JSON object")
    if chunk.get("error"):
        raise OpenAIResponderError("the server reported an error in the stream")
    choices = chunk.get("choices")
    if not isinstance(choices, list):
        raise OpenAIResponderError("a stream event has no choices")
    if not choices:  # e.g. a usage-only chunk
        return "", False
    choice = choices[0]
    if not isinstance(choice, dict):
        raise OpenAIResponderError("a stream event has a malformed choice")
    delta = choice.get("delta") or {}
    content = delta.get("content") if isinstance(delta, dict) else None
    if content is not None and not isinstance(content, str):
        raise OpenAIResponderError("a stream event has non-text content")
    return content or "", choice.get("finish_reason") is not None


def stream_pieces(lines: Iterable[bytes | str]) -> Iterator[str]:
    """The answer a chat-completions stream spells out, piece by piece as it arrives:
    ``choices[0].delta.content`` of each event, up to ``data: [DONE]``. A stream that
    stops before [DONE] or a finish reason, holds anything malformed, or says nothing
    raises OpenAIResponderError (after the pieces before it)."""
    finished = said = False
    for data in sse_events(lines):
        if data.strip() == DONE:
            finished = True
            break
        try:
            chunk = json.loads(data)
        except ValueError:
            raise OpenAIResponderError("a stream event is not valid JSON") from None
        text, done = _delta_content(chunk)
        if text:
            said = said or bool(text.strip())
            yield text
        finished = finished or done
    if not finished:
        raise OpenAIResponderError("the stream ended before the answer did")
    if not said:
        raise OpenAIResponderError("the server gave an empty answer")


def _bounded_lines(response: Any, deadline: float) -> Iterator[bytes]:
    # The socket timeout bounds each read; this bounds the whole answer, in time and size
    # (a line without an end included).
    total = 0
    while line := response.readline(MAX_STREAM_BYTES - total + 1):
        total += len(line)
        if total > MAX_STREAM_BYTES:
            raise OpenAIResponderError("the answer is too long")
        if time.monotonic() > deadline:
            raise TimeoutError("the answer took longer than ORBITPILOT_OPENAI_TIMEOUT")
        yield line


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    # urllib would follow a redirect as a GET, losing the body and taking the key along to
    # wherever it points; a 3xx is an HTTPError instead.
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


_OPENER = urllib.request.build_opener(_NoRedirects)


def chat_completion_pieces(url: str, messages: list[dict[str, str]], *, model: str,
                           api_key: str | None = None,
                           timeout: float = DEFAULT_TIMEOUT) -> Iterator[str]:
    """POST the messages to ``url`` with ``"stream": true`` and yield the answer as it
    arrives. Connection errors, timeouts and non-2xx answers (urllib's HTTPError,
    redirects too) propagate."""
    body = json.dumps({"model": model, "messages": messages, "stream": True}).encode()
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    deadline = time.monotonic() + timeout
    with _OPENER.open(request, timeout=timeout) as response:
        yield from stream_pieces(_bounded_lines(response, deadline))




class OpenAIResponder:
    """The chat's responder for an OpenAI-compatible server; made once by
    ``load_responder``. The edge binds it to the app's settings (``configured``), read at
    each call, so a missing one is a refused reply, not an error page."""

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        self.config = config

    def configured(self, config: Mapping[str, Any]) -> OpenAIResponder:
        return OpenAIResponder(config)

    def stream(self, context: ResponderContext) -> Iterator[str]:
        """The answer as the server streams it (the chat passes it on as it comes)."""
        settings = current_settings(self.config)
        yield from chat_completion_pieces(settings.url, build_messages(context),
                                          model=settings.model, api_key=settings.api_key,
                                          timeout=settings.timeout)

    def __call__(self, context: ResponderContext) -> Reply:
        return Reply("".join(self.stream(context)).strip(), drew_on_summary(context))
