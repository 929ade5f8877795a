"""The one exception the embedded servers raise: a sentence saying what to look at."""

from __future__ import annotations


class EmbeddedError(RuntimeError):
    """An embedded server could not be made ready; the message says what to look at."""
