"""Whether a memory covers a question: each content word of the question finds a
counterpart among the memory's words (late interaction over MiniLM's token states). A
memory about the question's subject but not the thing asked ("my sister's name?" beside
"My brother Tom…") is near as a whole, yet its least-covered word is not; a paraphrase's
words each find one. It confirms that an English hit within the sure distance is
relevant. Measured: docs/architecture/retrieval.md."""

from __future__ import annotations

import numpy as np

# Words that carry no subject of their own (and the pieces of English contractions the
# tokenizer splits off: "sister's" → sister ' s).
STOPWORDS = frozenset("""
a about am an and any are as at be been being but by can could did do does doing for from
had has have having he her hers him his how i if in into is it its just me mine my no nor
not of on or our ours she should so some than that the their theirs them then there these
they this those to too us very was we were what when where which while who whom why will
with would you your yours s t d ll m re ve
""".split())


def content_token(token: str) -> bool:
    """A token that names something: not punctuation, not a stop word ("##" pieces of a
    longer word count)."""
    if not any(c.isalnum() for c in token):
        return False
    return token.startswith("##") or token not in STOPWORDS


def coverage(asked: np.ndarray, texts: list[np.ndarray]) -> list[float]:
    """Per text (its content tokens' unit vectors), the cosine at which the question's
    least-covered content word (``asked``) finds its best counterpart there: 1.0 for a
    question with no content word (nothing to miss), 0.0 for a text with none."""
    if not len(asked):
        return [1.0] * len(texts)
    return [float((asked @ tokens.T).max(axis=1).min()) if len(tokens) else 0.0
            for tokens in texts]
