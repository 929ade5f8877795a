"""The periodic tasks a worker runs (each once per interval across all workers, by a
lease): the sweeper, idle conversations, the schedule, a model change's rebuilds, the
audit checkpoint and its anchor, the erasure VACUUM, retention, the truth check. A failing task is
logged by kind and does not stop the others. And the audit checkpoint once more when a
worker stops."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from dashboard import memory
from dashboard.audit.anchors import Anchoring
from dashboard.audit.services import anchor_head, checkpoint_chain
from dashboard.exports import tend_exports
from dashboard.leases import claim_lease
from dashboard.orbitpilot import conversations as chat
from dashboard.retention import apply_retention
from dashboard.saved_memories.erasure import vacuum_after_erasures

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PeriodicTask:
    name: str
    setting: str  # the config key holding its interval in seconds (0: off)
    run: Callable[[Session, memory.BuildQueue, Mapping[str, Any]], object]


def _erasure_vacuum(session: Session, queue: memory.BuildQueue,
                    config: Mapping[str, Any]) -> object:
    # End the session's transaction first: the VACUUM runs on a connection of its own, and
    # a snapshot held here would keep back the very row versions it is meant to remove.
    session.commit()
    return vacuum_after_erasures(session)


def _audit_checkpoint(session: Session, queue: memory.BuildQueue | None,
                      config: Mapping[str, Any]) -> object:
    checkpoint_chain(session)
    session.commit()  # the row stands even if the anchor store fails
    return anchor_head(session, Anchoring.from_settings(config))


def _exports(session: Session, queue: memory.BuildQueue, config: Mapping[str, Any]) -> object:
    return tend_exports(session, lost=queue.lost,
                        push=lambda calls: queue.push([("call", c) for c in calls]))


PERIODIC_TASKS: tuple[PeriodicTask, ...] = (
    PeriodicTask("sweep", "BUILD_SWEEP_SECONDS",
                 lambda session, queue, config: memory.sweep_builds(session, queue)),
    PeriodicTask("idle_conversations", "BUILD_SWEEP_SECONDS",
                 lambda session, queue, config: chat.request_idle_conversation_builds(
                     session, idle_minutes=queue.settings.idle_minutes)),
    PeriodicTask("schedule", "BUILD_SCHEDULE_SECONDS",
                 lambda session, queue, config: memory.request_scheduled_builds(
                     session, margin_seconds=queue.settings.schedule_margin_seconds)),
    PeriodicTask("model_change", "BUILD_SWEEP_SECONDS",
                 lambda session, queue, config: memory.request_model_change_builds(
                     session, model=memory.embedder_model_name(config["EMBEDDER"]),
                     batch=config["MODEL_CHANGE_BATCH"])),
    PeriodicTask("exports", "BUILD_SWEEP_SECONDS", _exports),
    PeriodicTask("audit_checkpoint", "AUDIT_CHECKPOINT_SECONDS", _audit_checkpoint),
    PeriodicTask("erasure_vacuum", "ERASURE_VACUUM_SECONDS", _erasure_vacuum),
    PeriodicTask("retention", "RETENTION_SECONDS",
                 lambda session, queue, config: apply_retention(session, config=config)),
    PeriodicTask("memory_verify", "MEMORY_VERIFY_SECONDS",
                 lambda session, queue, config: memory.verify_memory(
                     session, ann_threshold=queue.settings.ann_min_chunks,
                     ann_leave=queue.settings.ann_leave_chunks)),
)


def run_due_tasks(session: Session, config: Mapping[str, Any], queue: memory.BuildQueue, *,
                  holder: str = "") -> list[str]:
    """Run each task whose interval (``config``) has passed and whose lease this caller
    wins; the names of those that ran."""
    ran = []
    for task in PERIODIC_TASKS:
        every = config[task.setting]
        if not every:
            continue
        try:
            if not claim_lease(session, task.name, every, holder):
                continue
            task.run(session, queue, config)
            session.commit()
            ran.append(task.name)
        except Exception as exc:
            session.rollback()
            log.warning("periodic task %s failed: %s", task.name, type(exc).__name__)
    return ran


def checkpoint_at_shutdown(session: Session, config: Mapping[str, Any]) -> bool:
    """The audit checkpoint and its anchor once more, out of turn (no lease), as a worker
    stops: the events of its last seconds are not left for another worker's next pass,
    or for none. Off with the periodic one; whether it ran."""
    if not config["AUDIT_CHECKPOINT_SECONDS"]:
        return False
    try:
        _audit_checkpoint(session, None, config)
        session.commit()
        return True
    except Exception as exc:
        session.rollback()
        log.warning("the audit checkpoint at shutdown failed: %s", type(exc).__name__)
        return False
