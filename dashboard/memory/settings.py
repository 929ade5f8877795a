"""The memory engine's settings, read once from the app's configuration by the edge that
calls the engine (a view, a job, a command) and passed in: the engine reads no app."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# The default of ANN_MIN_CHUNKS (also migration 0006's threshold).
DEFAULT_ANN_MIN_CHUNKS = 50_000
# A user in the HNSW index leaves it only below this fraction of ANN_MIN_CHUNKS (40,000
# by default): one hovering at the threshold is not moved in and out at each build.
DEFAULT_ANN_LEAVE_FRACTION = 0.8
# Rows the indexing job moves into the HNSW index per transaction: 500 rows take ~0.7-1.4 s
# at 370-760 rows/s and ~9 s at 54 rows/s (a busy machine, a large index), short of the
# 30 s a forget waits for the user's lock (docs/architecture/retrieval.md).
DEFAULT_ANN_INDEX_BATCH = 500


def ann_leave_mark(threshold: int, fraction: float = DEFAULT_ANN_LEAVE_FRACTION) -> int:
    """The chunk count below which a user leaves the HNSW index (``threshold`` is
    ANN_MIN_CHUNKS; the mark is never above it)."""
    return min(threshold, int(threshold * fraction))


@dataclass(frozen=True)
class EngineSettings:
    embedder: str = "hashing"
    queue_name: str = "builds"
    job_timeout: int = 900
    max_attempts: int = 3
    retry_intervals: tuple[int, ...] = (10, 60)
    heartbeat_seconds: float = 5.0
    stale_seconds: float = 60.0
    requeue_seconds: float = 30.0
    user_build_interval: int = 60
    idle_minutes: int = 30
    schedule_margin_seconds: float = 60.0
    fanout_batch: int = 500
    # Builds asked in one commit go to workers this many to a job (``run_builds``).
    build_batch: int = 50
    ann_min_chunks: int = DEFAULT_ANN_MIN_CHUNKS
    ann_leave_fraction: float = DEFAULT_ANN_LEAVE_FRACTION
    ann_index_batch: int = DEFAULT_ANN_INDEX_BATCH
    recall_max_distance: float | None = None  # None: the embedder's own cut
    # Jobs pushed to RQ: how long their results and failures are kept.
    result_ttl: int = field(default=3600)
    failure_ttl: int = field(default=7 * 24 * 3600)

    @property
    def ann_leave_chunks(self) -> int:
        return ann_leave_mark(self.ann_min_chunks, self.ann_leave_fraction)


def settings_from(config: Mapping[str, Any]) -> EngineSettings:
    """The engine's settings out of an app's configuration (``dashboard/config.py``)."""
    return EngineSettings(
        embedder=config["EMBEDDER"],
        queue_name=config["BUILD_QUEUE"],
        job_timeout=config["BUILD_JOB_TIMEOUT"],
        max_attempts=config["BUILD_MAX_ATTEMPTS"],
        retry_intervals=tuple(config["BUILD_RETRY_INTERVALS"]),
        heartbeat_seconds=config["BUILD_HEARTBEAT_SECONDS"],
        stale_seconds=config["BUILD_STALE_SECONDS"],
        requeue_seconds=config["BUILD_REQUEUE_SECONDS"],
        user_build_interval=config["USER_BUILD_INTERVAL_SECONDS"],
        idle_minutes=config["CONVERSATION_IDLE_MINUTES"],
        schedule_margin_seconds=config["BUILD_SCHEDULE_MARGIN_SECONDS"],
        fanout_batch=config["BUILD_FANOUT_BATCH"],
        build_batch=config["BUILD_BATCH"],
        ann_min_chunks=config["ANN_MIN_CHUNKS"],
        ann_leave_fraction=config.get("ANN_LEAVE_FRACTION", DEFAULT_ANN_LEAVE_FRACTION),
        ann_index_batch=config.get("ANN_INDEX_BATCH", DEFAULT_ANN_INDEX_BATCH),
        recall_max_distance=config.get("RECALL_MAX_DISTANCE"),
    )
