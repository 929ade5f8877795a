"""MiniLM in bfloat16 gives the float32 model's vectors (no re-embed: the same name), and the
precision it runs at is chosen by argument, ``MINILM_PRECISION`` or the CPU, and reported."""

import os

import numpy as np
import pytest

from dashboard.memory.embedders import cpu_has_bf16, minilm_available, minilm_precision

requires_ml = pytest.mark.skipif(
    not minilm_available() and os.environ.get("CI", "").lower() not in {"1", "true"},
    reason="the ml extra (all-MiniLM-L6-v2) is not installed",
)

SHORT = [
    "I am allergic to peanuts.", "My partner's birthday is on the 14th of March.",
    "I adopted a puppy named Rex last spring.", "The quarterly tax filing is due in April.",
    "My favourite city for a weekend away is Lisbon.", "I prefer window seats on flights.",
    "Standup happens at 9:30 every weekday.", "Use British spelling in every document.",
    "The staging database is backed up nightly at 2 am.", "I'm training for a half marathon.",
    "Never schedule meetings on Friday afternoons.", "My landlord is called Mr Okafor.",
    "I take the 7:42 train to work.", "We chose PostgreSQL over MySQL for the new service.",
    "My daughter plays the cello.", "Invoices go out on the first Monday of the month.",
    "I'm vegetarian but I eat fish.", "The wifi password at the cabin is on the fridge.",
    "I want to learn Portuguese this year.", "Our team retro is every second Thursday.",
    "ok", "thanks!", "Berlin", "remind me later", "What did we decide about the logo?",
]
ASKS = [
    "Can you help me plan a long weekend in Porto in May?",
    "What should I pack for three days of hiking in the Alps?",
    "How do I keep my sourdough starter alive while I travel for two weeks?",
    "My puppy keeps pulling on the lead. Any tips?",
    "Could you summarise the key points from Tuesday's project meeting?",
]
ANSWERS = [
    "Spend the first morning in the old town and keep the afternoon for a museum.",
    "Pack layers, a waterproof shell and a spare pair of socks for every day.",
    "Feed the starter a large meal before you leave and keep it in the fridge.",
    "Stop walking whenever the lead goes tight and reward him when he comes back.",
    "The meeting moved the deadline to the 14th and gave the testing work to Marta.",
    "Book the train a few weeks ahead; the fares roughly double in the last week.",
    "If anything changes, tell me and I will adjust the plan.",
    "I can also put this on your calendar as a reminder for Friday.",
]
# 25 chat-length pairs (~90-110 tokens): one question, its answer, then four more sentences.
CHAT = [f"User: {ASKS[i % 5]}\nOrbitPilot: {ANSWERS[i % 5]} "
        + " ".join(ANSWERS[(i + j) % 8] for j in (1, 2, 3, 5 + i % 2))
        for i in range(25)]
TEXTS = SHORT + CHAT
QUERIES = ["nut allergy", "when is my partner's birthday", "my dog",
           "which database did we pick", "keeping bread dough alive on holiday",
           "the morning meeting time", "what to bring on a mountain walk", "how do I get to work"]


@pytest.fixture(scope="module")
def both():
    from dashboard.memory.embedders import MiniLMEmbedder

    return MiniLMEmbedder(precision="fp32"), MiniLMEmbedder(precision="bf16")


@requires_ml
def test_bf16_vectors_are_the_fp32_vectors(both):
    fp32, bf16 = both
    assert (fp32.precision, bf16.precision) == ("fp32", "bf16")
    assert fp32.name == bf16.name == "all-MiniLM-L6-v2"  # stored chunks stay valid
    a, b = fp32.embed(TEXTS), bf16.embed(TEXTS)
    assert a.shape == b.shape == (len(TEXTS), 384)
    assert a.dtype == b.dtype == np.float32
    assert np.allclose(np.linalg.norm(b, axis=1), 1.0, atol=1e-5)
    cosines = np.sum(a * b, axis=1)
    assert cosines.mean() >= 0.999 and cosines.min() >= 0.995, (cosines.mean(), cosines.min())


@requires_ml
def test_bf16_finds_the_same_nearest_text(both):
    fp32, bf16 = both
    corpus_a, corpus_b = fp32.embed(TEXTS), bf16.embed(TEXTS)
    top_a = np.argmax(fp32.embed(QUERIES) @ corpus_a.T, axis=1)
    top_b = np.argmax(bf16.embed(QUERIES) @ corpus_b.T, axis=1)
    assert [TEXTS[i] for i in top_b] == [TEXTS[i] for i in top_a]
    assert TEXTS[top_a[0]] == "I am allergic to peanuts."  # and the answers make sense
    # Every text as a query over the others: the same nearest neighbour.
    self_a, self_b = corpus_a @ corpus_a.T, corpus_b @ corpus_b.T
    np.fill_diagonal(self_a, -2)
    np.fill_diagonal(self_b, -2)
    assert (np.argmax(self_a, axis=1) == np.argmax(self_b, axis=1)).mean() >= 0.95


@requires_ml
def test_the_precision_is_chosen_by_argument_setting_or_cpu(monkeypatch):
    from dashboard.memory.embedders import MiniLMEmbedder

    monkeypatch.delenv("MINILM_PRECISION", raising=False)
    assert minilm_precision() == ("bf16" if cpu_has_bf16() else "fp32")
    monkeypatch.setenv("MINILM_PRECISION", "fp32")
    assert minilm_precision("bf16") == "bf16"  # the argument wins
    monkeypatch.setenv("MINILM_PRECISION", " BF16 ")
    assert minilm_precision() == "bf16"
    # The embedder runs at what was chosen (one model load: each takes a second or two).
    monkeypatch.setenv("MINILM_PRECISION", "fp32")
    assert MiniLMEmbedder().precision == "fp32"


def test_a_precision_setting_is_read_with_care(monkeypatch):
    monkeypatch.setenv("MINILM_PRECISION", "auto")
    if minilm_available():
        assert minilm_precision() == ("bf16" if cpu_has_bf16() else "fp32")
    monkeypatch.setenv("MINILM_PRECISION", "fp16")
    with pytest.raises(ValueError, match="fp16"):
        minilm_precision()
    assert minilm_precision("fp32") == "fp32"
    with pytest.raises(ValueError, match="int8"):
        minilm_precision("int8")
