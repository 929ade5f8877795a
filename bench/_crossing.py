"""Crossing ANN_MIN_CHUNKS, measured: the build that takes a user over the threshold, then
the indexing job that moves the user's rows into the HNSW index, run inline.

    from bench._crossing import measure_crossing
    figures = measure_crossing(app, 100_000)

``app``: an app on a bench database of its own, migrated (``bench._setup.migrated_app``).
Nothing passes or fails; the caller prints the figures."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np
from sqlalchemy import create_engine, func, insert, select
from sqlalchemy.orm import Session

from dashboard.extensions import db

WORDS = ("lisbon porto budget flight hotel museum dinner recipe garden meeting project "
         "deadline invoice puppy training running marathon coffee book chapter").split()
K = 10
QUERIES = ("hotel dinner in lisbon", "marathon training and running", "project deadline "
           "invoice", "a recipe book chapter")


def measure_crossing(app: Any, pairs: int) -> dict[str, Any]:
    """One user of ``pairs`` chat pairs (a chunk each), one full build with the threshold at
    min(ANN_MIN_CHUNKS, pairs), then the indexing job inline (ANN_INDEX_BATCH rows a batch);
    recall (k 10, four queries) against SQL's exact answer after the build, the first
    batch, half way and the last. Returns ``pairs``, ``chunks``, ``threshold``, ``batch``,
    ``build_transaction_s`` (commit included), ``batches``, ``longest_batch_s``,
    ``longest_transaction_s`` (the longer: what a build or forget may wait behind),
    ``index_s``, ``index_rows_per_s``, ``indexing_requested``, ``ready`` (at the end),
    ``recall_exact`` (k rows at the exact distances, in order, at every checkpoint before
    the flag), ``recall_ready`` (recall@10 once ready: the HNSW path, approximate) and
    ``checkpoints`` (each: ``at``, ``ann_rows``, ``ready``, ``k_rows``, ``exact_order``,
    ``recall``)."""
    from dashboard import memory
    from dashboard.memory.embedders import HashingEmbedder
    from dashboard.memory.pipeline import run_memory_build

    embedder = HashingEmbedder()
    with app.app_context():
        config = memory.settings_from(app.config)
        settings = dataclasses.replace(config, ann_min_chunks=min(config.ann_min_chunks,
                                                                  pairs))
        # An engine no queue is bound to: the indexing job the build asks for is not
        # pushed (a worker would run it against its own database), it is run here.
        engine = create_engine(db.engine.url)
    try:
        with Session(engine) as session:
            user_id = _chat_user(session, pairs)
            checkpoints: list[dict[str, Any]] = []
            started = time.perf_counter()
            result = run_memory_build(
                session.get(_user_model(), user_id), "full", session=session,
                embedder=embedder, ann_threshold=settings.ann_min_chunks,
                ann_leave=settings.ann_leave_chunks, ann_batch=settings.ann_index_batch)
            session.commit()
            build_s = time.perf_counter() - started
            checkpoints.append(_checkpoint(session, user_id, "after the build", embedder))
            total = result.added + result.kept
            expected = -(-total // settings.ann_index_batch)
            wanted = {1, max(1, expected // 2)}
            seen = [0]

            def after_batch(step: Any) -> None:
                seen[0] += 1
                if step.done:
                    checkpoints.append(_checkpoint(session, user_id, "after the last batch",
                                                   embedder))
                elif seen[0] in wanted:
                    checkpoints.append(_checkpoint(session, user_id,
                                                   f"after batch {seen[0]}", embedder))

            outcome = memory.index_user_ann(session, user_id, settings=settings,
                                            after_batch=after_batch)
    finally:
        engine.dispose()
    longest_batch = max(outcome.seconds, default=0.0)
    crossing = [c for c in checkpoints if not c["ready"]]
    after = [c["recall"] for c in checkpoints if c["ready"]]
    return {
        "pairs": pairs, "chunks": total, "threshold": settings.ann_min_chunks,
        "batch": settings.ann_index_batch, "build_transaction_s": round(build_s, 3),
        "indexing_requested": result.indexing, "batches": outcome.batches,
        "longest_batch_s": round(longest_batch, 3),
        "longest_transaction_s": round(max(build_s, longest_batch), 3),
        "index_s": round(sum(outcome.seconds), 3),
        "index_rows_per_s": round(outcome.rows / sum(outcome.seconds)) if outcome.rows else 0,
        "ready": outcome.state == "ready",
        "recall_exact": all(c["k_rows"] and c["exact_order"] for c in crossing),
        "recall_ready": after[-1] if after else None,
        "checkpoints": checkpoints,
    }


def _user_model() -> Any:
    from dashboard.auth.models import User

    return User


def _chat_user(session: Session, pairs: int) -> int:
    """A user on a plan including chat history, ``pairs`` answered pairs of word salad
    over up to 100 conversations; committed. Its id."""
    from dashboard.orbitpilot.models import Conversation, Message
    from dashboard.plans.models import Plan

    stamp = f"{time.time_ns()}"
    plan = Plan(name=f"crossing-{stamp}", slug=f"crossing-{stamp}", included_sources=4)
    session.add(plan)
    session.flush()
    user = _user_model()(email=f"crossing-{stamp}@bench.test", display_name="bench",
                         password_hash="x", plan_id=plan.id)
    session.add(user)
    session.flush()
    count = max(1, min(100, pairs // 100 or 1))
    conversations = session.execute(insert(Conversation).returning(Conversation.id), [
        {"user_id": user.id, "title": f"bench {n}"} for n in range(count)]).scalars().all()
    rng = np.random.default_rng(1)
    turns = [(conversations[i % count], i // count) for i in range(pairs)]
    questions = session.execute(insert(Message).returning(Message.id), [
        {"conversation_id": conv, "user_id": user.id, "role": "user", "position": 2 * index,
         "content": " ".join(rng.choice(WORDS, 12)) + f" #{n}?"}
        for n, (conv, index) in enumerate(turns)]).scalars().all()
    session.execute(insert(Message), [
        {"conversation_id": conv, "user_id": user.id, "role": "assistant",
         "position": 2 * index + 1, "content": "Answer: " + " ".join(rng.choice(WORDS, 25)),
         "reply_to_id": questions[n]}
        for n, (conv, index) in enumerate(turns)])
    session.commit()
    return user.id


def _checkpoint(session: Session, user_id: int, at: str, embedder: Any) -> dict[str, Any]:
    from dashboard.memory import MemoryChunk, MemoryState, search_memory

    ann_rows = session.scalar(select(func.count()).select_from(MemoryChunk).where(
        MemoryChunk.user_id == user_id, MemoryChunk.ann))
    ready = bool(session.scalar(select(MemoryState.ann_ready)
                                .where(MemoryState.user_id == user_id)))
    k_rows = exact_order = True
    recalls = []
    for query in QUERIES:
        hits = search_memory(session, user_id, query, K, embedder=embedder)
        vector = embedder.embed([query])[0]
        distance = MemoryChunk.embedding.cosine_distance(vector)
        truth = session.execute(select(MemoryChunk.id, distance)
                                .where(MemoryChunk.user_id == user_id)
                                .order_by(distance, MemoryChunk.id).limit(K)).all()
        k_rows &= len(hits) == K
        # Equal distances may come in either order: the order checked is the distances'.
        exact_order &= [round(h.distance, 5) for h in hits] == \
            [round(d, 5) for _, d in truth]
        recalls.append(len({h.chunk_id for h in hits} & {i for i, _ in truth}) / K)
    session.commit()
    return {"at": at, "ann_rows": ann_rows, "ready": ready, "k_rows": k_rows,
            "exact_order": exact_order, "recall": round(sum(recalls) / len(recalls), 3)}
