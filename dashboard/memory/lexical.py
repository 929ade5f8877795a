"""What full-text recall looks for in a query: its names, codes and identifiers ("Heron",
"BL-422", "ECONNRESET"), the words an embedding is most likely to miss. Only those: a
chunk holding one of them is a plausible answer whatever its distance (it survives the
recall cut), which an everyday word ("outcome", "likes") would not make it.
docs/architecture/retrieval.md."""

from __future__ import annotations

import re

from dashboard.memory.models import NO_SPACE_SCRIPTS

# Set apart, as the chunks' ``lexemes`` set them apart: "BL-422怎么样了" holds "BL-422".
_APART = re.compile(f"[{NO_SPACE_SCRIPTS}]")
# A word, or words joined by a connector ("BL-422", "foo_bar", "api.example.com").
_WORD = re.compile(r"[^\W_]+(?:[-_./@][^\W_]+)*")
_SENTENCE_END = re.compile(r"[.!?¿¡…:;\"“”«»()\[\]]\s*$")
# Words that a capital or a query of one word does not make a name (English, French).
_COMMON = frozenset("""
a an and are as at be been but by can could did do does for from had has have he her his
how i if in into is it its me my no not of on or our she should so than that the their
them then there these they this those to us was we were what when where which who whom
whose why will with would you your
à au aux avec ce ces cet cette comment dans de des du elle elles en est et eux il ils je
la le les leur lui ma mes moi mon ne nos notre nous on ou où par pas pour pourquoi qu
quand que quel quelle quelles quels qui quoi sa se ses son sur ta te tes toi ton tu un une
vos votre vous y
""".split())
# At most this many terms: a pasted paragraph does not make a query of hundreds.
MAX_TERMS = 16


def _identifier(word: str, cased: bool) -> bool:
    """A code or identifier: a digit in it (a pure number: three digits or more), a
    connector other than a hyphen ("foo_bar", "a.b", "x@y"), or a capital after its
    first letter ("ECONNRESET", "iPhone", "BL"), unless the query is all capitals. A
    hyphen alone makes none: "well-known" is a word."""
    if word.isdigit():
        return len(word) >= 3
    if any(c.isdigit() for c in word) or any(c in "_./@" for c in word):
        return True
    return cased and any(c.isupper() for c in word[1:])


def names_a_code(terms: list[str]) -> bool:
    """Whether a term is a code or identifier, not only a name: a chunk holding "BL-422"
    answers a question about it, one holding "Heron" may be about something else."""
    return any(_identifier(term, True) for term in terms)


def lexical_terms(query: str) -> list[str]:
    """The query's names, codes and identifiers, in order, each once: identifiers
    (``_identifier``), a capitalised word that does not begin a sentence ("Heron" in
    "where is Heron at"), and a query's only word. Common words never count. A name
    typed in lower case mid-sentence is left to the vectors: nothing tells it from a
    word."""
    text = _APART.sub(" ", query)
    words = list(_WORD.finditer(text))
    # A sentence typed in capitals ("WHERE DID MY TRIP GO"): case says nothing there. A
    # code or two in capitals beside Chinese, which has no case, is not one.
    cased = any(c.islower() for c in text) or sum(
        m.group().isalpha() and m.group().isupper() for m in words) < 3
    terms: dict[str, str] = {}
    for match in words:
        word = match.group()
        key = word.lower()
        if len(word) < 2 or key in _COMMON or key in terms:
            continue
        opens = not text[:match.start()].strip() or bool(
            _SENTENCE_END.search(text[:match.start()]))
        if _identifier(word, cased) or (cased and word[0].isupper() and not opens) \
                or len(words) == 1:
            terms[key] = word
    return list(terms.values())[:MAX_TERMS]


def tsquery_text(terms: list[str]) -> str:
    """``to_tsquery`` input finding any of ``terms``: each quoted, so the server reads it
    with the very parser that made the chunks' lexemes ("BL-422" → 'bl' <-> '-422'). A
    term holds only letters, digits and ``-_./@`` (``_WORD``): nothing to escape."""
    return " | ".join(f"'{term}'" for term in terms)
