"""MiniLM run by NumPy gives the vectors the sentence-transformers library gives (kept in
data/minilm_reference.json, made by bench/minilm_reference.py), so chunks stored under the
model's name stay valid; a batch's padding changes no row; nothing imports torch."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dashboard.memory.embedders import MiniLMEmbedder, minilm_available

requires_ml = pytest.mark.skipif(
    not minilm_available() and os.environ.get("CI", "").lower() not in {"1", "true"},
    reason="the ml extra (all-MiniLM-L6-v2) is not installed",
)
REFERENCE = json.loads((Path(__file__).parent / "data/minilm_reference.json")
                       .read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def minilm() -> MiniLMEmbedder:
    return MiniLMEmbedder()


@requires_ml
def test_the_vectors_are_the_librarys(minilm):
    texts, expected = REFERENCE["texts"], np.array(REFERENCE["vectors"], dtype=np.float32)
    padded = minilm.embed(texts)
    assert minilm.name == "all-MiniLM-L6-v2"  # stored chunks stay valid
    # Zeros beyond its 384 dimensions, to the column's width: no cosine changes.
    assert padded.shape == (len(texts), 896) and not padded[:, 384:].any()
    got = padded[:, :384]
    assert got.shape == expected.shape == (len(texts), 384) and got.dtype == np.float32
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    # French, Chinese, emoji, an empty text and one past the 256-token cut included.
    assert np.abs(got - expected).max() < 1e-5, np.abs(got - expected).max(axis=1)
    assert np.sum(got * expected, axis=1).min() > 0.99999


@requires_ml
def test_a_text_gets_the_same_vector_alone_or_padded_in_a_batch(minilm):
    texts = REFERENCE["texts"][:-1]  # the 256-token one would pad all of them to it
    alone = np.vstack([minilm.embed([text]) for text in texts])
    assert np.abs(alone - minilm.embed(texts)).max() < 1e-5
    assert minilm.embed([]).shape == (0, 896)


@requires_ml
def test_embedding_imports_no_torch():
    code = ("import sys; from dashboard.memory.embedders import get_embedder; "
            "get_embedder('minilm').embed(['hello']); "
            "print(sorted(m for m in ('torch', 'transformers', 'sentence_transformers') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).parents[2], timeout=120)
    assert out.stdout.strip() == "[]"


@requires_ml
def test_a_forked_work_horse_embeds_after_its_parent_did(minilm):
    """A worker loads the model (and may have embedded) before it forks a work horse; the
    horse's first pass must not wait on thread pools that did not survive the fork."""
    texts = REFERENCE["texts"][:3]
    here = minilm.embed(texts)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the horse: embed, send the rows, leave without pytest's clean-up
        try:
            os.write(write, minilm.embed(texts).tobytes())
        finally:
            os._exit(0)
    os.close(write)
    deadline = time.monotonic() + 60
    while os.waitpid(pid, os.WNOHANG) == (0, 0):
        assert time.monotonic() < deadline, "the forked horse never finished its pass"
        time.sleep(0.05)
    with os.fdopen(read, "rb") as pipe:
        there = np.frombuffer(pipe.read(), dtype=np.float32).reshape(here.shape)
    assert np.abs(here - there).max() < 1e-6


@requires_ml
def test_onnx_runtime_runs_the_layers_with_numpys_vectors(minilm):
    """The ml extra brings ONNX Runtime: it runs the encoder, and gives NumPy's vectors."""
    from dashboard.memory.minilm import MiniLM, model_folder

    assert minilm._model.runtime == "onnxruntime"
    by_numpy = MiniLM(model_folder(), runtime="numpy")
    texts = REFERENCE["texts"]
    onnx = minilm._model.forward(*minilm._model.encode(texts))
    assert np.abs(onnx - by_numpy.forward(*by_numpy.encode(texts))).max() < 1e-5
