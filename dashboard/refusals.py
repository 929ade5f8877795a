"""Refusals: a service saying no, in a sentence written for the person who asked.

Services raise them and know nothing of HTTP. Each edge (the pages, the API, the staff
console, the CLI) maps a refusal's ``kind`` to its own answer in one table, and shows
``sentence``, never ``str()`` of an arbitrary exception (which can carry SQL or content)."""

from __future__ import annotations


class Refusal(ValueError):
    """A value or request a service refused; ``field`` names the input it is about."""

    kind = "invalid"

    def __init__(self, sentence: str, field: str | None = None) -> None:
        super().__init__(sentence)
        self.sentence = sentence
        self.field = field


class FieldError(Refusal):
    """A value refused, with the name of the form field it is about."""

    def __init__(self, sentence: str, field: str) -> None:
        super().__init__(sentence, field)


class Forbidden(Refusal):
    """The asker may not do this (a missing scope, a staff-only grant)."""

    kind = "forbidden"


class NotFound(Refusal):
    """Nothing of the asker's has this id: the same for someone else's and for none."""

    kind = "not_found"


class Gone(Refusal):
    """It existed and was permanently deleted; only its record remains."""

    kind = "gone"


class Conflict(Refusal):
    """Its state does not allow this now (restoring a redacted memory, an ended chat)."""

    kind = "conflict"


class Busy(Refusal):
    """Something held on longer than the asker may wait; nothing changed, try again."""

    kind = "busy"
    retry_after = 30


class TooSoon(Refusal):
    """Asked again before the allowed interval passed."""

    kind = "too_soon"

    def __init__(self, sentence: str, retry_after: int) -> None:
        super().__init__(sentence)
        self.retry_after = retry_after


class Failed(Refusal):
    """A part the service depends on failed to answer (the chat's responder)."""

    kind = "failed"


KINDS = ("invalid", "forbidden", "not_found", "gone", "conflict", "busy", "too_soon", "failed")
