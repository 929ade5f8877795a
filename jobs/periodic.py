"""The periodic tasks a worker runs (each once per interval across all workers, by a
lease): the sweeper, idle conversations, the schedule, the audit checkpoint, the erasure
VACUUM. A failing task is logged by kind and does not stop the others."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from dashboard import memory
from dashboard.audit.services import checkpoint_chain
from dashboard.leases import claim_lease
from dashboard.memories.erasure import vacuum_after_erasures

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PeriodicTask:
    name: str
    setting: str  # the config key holding its interval in seconds (0: off)
    run: Callable[[Session, memory.BuildQueue], object]


def _erasure_vacuum(session: Session, queue: memory.BuildQueue) -> object:
    # End the session's transaction first: the VACUUM runs on a connection of its own, and
    # a snapshot held here would keep back the very row versions it is meant to remove.
    session.commit()
    return vacuum_after_erasures(session)


PERIODIC_TASKS: tuple[PeriodicTask, ...] = (
    PeriodicTask("sweep", "BUILD_SWEEP_SECONDS", memory.sweep_builds),
    PeriodicTask("idle_conversations", "BUILD_SWEEP_SECONDS",
                 lambda session, queue: memory.request_idle_conversation_builds(
                     session, idle_minutes=queue.settings.idle_minutes)),
    PeriodicTask("schedule", "BUILD_SCHEDULE_SECONDS",
                 lambda session, queue: memory.request_scheduled_builds(
                     session, margin_seconds=queue.settings.schedule_margin_seconds)),
    PeriodicTask("audit_checkpoint", "AUDIT_CHECKPOINT_SECONDS",
                 lambda session, queue: checkpoint_chain(session)),
    PeriodicTask("erasure_vacuum", "ERASURE_VACUUM_SECONDS", _erasure_vacuum),
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
            task.run(session, queue)
            session.commit()
            ran.append(task.name)
        except Exception as exc:
            session.rollback()
            log.warning("periodic task %s failed: %s", task.name, type(exc).__name__)
    return ran
