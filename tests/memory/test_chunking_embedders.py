import numpy as np

from dashboard.memory.chunking import chunk_text, content_hash
from dashboard.memory.embedders import HashingEmbedder, get_embedder
from dashboard.memory.models import EMBEDDING_DIMENSIONS


def test_short_text_is_one_chunk_and_long_text_is_split_deterministically():
    assert chunk_text("  hello world ") == ["hello world"]
    assert chunk_text("   ") == []
    paragraph = "Sentence number one is here. " * 40
    text = "\n\n".join([paragraph.strip()] * 5)
    chunks = chunk_text(text, max_chars=500)
    assert len(chunks) > 1
    assert all(len(c) <= 500 for c in chunks)
    assert chunks == chunk_text(text, max_chars=500)
    no_breaks = "x" * 1300
    assert [len(c) for c in chunk_text(no_breaks, max_chars=500)] == [500, 500, 300]


def test_content_hash_is_sha256_of_the_text():
    assert content_hash("abc") == \
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_hashing_embedder_is_deterministic_normalised_and_384_wide_in_the_column():
    embedder = HashingEmbedder()
    a, b, empty = embedder.embed(["Lisbon trip in May", "Lisbon trip in May", ""])
    assert a.shape == (EMBEDDING_DIMENSIONS,) and a.dtype == np.float32
    assert a[:384].any() and not a[384:].any()  # padded: the same cosines as before
    assert np.allclose(a, b)
    assert abs(np.linalg.norm(a) - 1.0) < 1e-5
    assert not empty.any()
    near, far = embedder.embed(["packing for the Lisbon trip", "quarterly tax filing"])
    assert float(a @ near) > float(a @ far)


def test_unknown_embedder_name_is_a_clear_error():
    import pytest

    with pytest.raises(ValueError, match="unknown EMBEDDER 'bert'"):
        get_embedder("bert")
    assert get_embedder("hashing") is get_embedder("hashing")


def test_a_worker_loads_its_embedder_once_before_it_forks_any_work_horse(app, queue,
                                                                         monkeypatch):
    """Work horses inherit the loaded embedder: no build loads a model."""
    import gc

    from dashboard import memory
    from jobs.worker import run_worker

    loaded = []
    monkeypatch.setattr(memory, "preload_embedder", loaded.append)
    monkeypatch.setattr(gc, "freeze", lambda: loaded.append("gc.freeze"))
    run_worker(app, burst=True, maintenance=False)
    assert loaded == [app.config["EMBEDDER"], "gc.freeze"]

