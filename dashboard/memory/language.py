"""Which language a short text is in, as far as recall needs to know: English or not. The
multilingual embedder adds MiniLM's judgement to an English question only (MiniLM reads
English alone: on a French or Chinese question it is noise). Function words decide; 98 %
right on the labelled questions in bench/data (docs/architecture/retrieval.md)."""

from __future__ import annotations

import re

_LETTER = re.compile(r"[^\W\d_]", re.UNICODE)
_WORD = re.compile(r"\b[^\W\d_]+\b", re.UNICODE)  # whole words: not "d" of "50d3"
ENGLISH_WORDS = frozenset(
    "the a an and or of to in on for with my i me what when where which who how is are was "
    "do does did have has should can about at from your you we our this that it".split())
FRENCH_WORDS = frozenset(
    "le la les l de des du d un une et est je j mon ma mes ton ta tes quel quelle quels "
    "quelles où ou pour avec dans que qui c ce cette qu n ne pas sur au aux en il elle nous "
    "vous suis ai".split())


def is_english(text: str) -> bool:
    """True for English, and for what holds no words to tell by (a code, a name)."""
    letters = _LETTER.findall(text)
    if not letters:
        return True
    if sum(c.isascii() for c in letters) < 0.9 * len(letters):
        return False  # Chinese, or French with its accents, …
    words = _WORD.findall(text.lower())
    english = sum(w in ENGLISH_WORDS for w in words)
    french = sum(w in FRENCH_WORDS for w in words)
    return english >= french
