"""The RQ queue that builds and plan fan-outs go to. Each app binds its queue to its
database engine once (``bind_queue``), so a transaction's commit knows where to push the
jobs it asked for without reaching for the app."""

from __future__ import annotations

import logging
import uuid
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from redis import Redis
from rq import Queue, Retry
from rq.job import Job, JobStatus
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from dashboard.memory.models import MemoryBuild
from dashboard.memory.settings import EngineSettings

log = logging.getLogger(__name__)

_LIVE_JOB_STATES = {JobStatus.QUEUED, JobStatus.STARTED, JobStatus.SCHEDULED,
                    JobStatus.DEFERRED}


def build_job_id(build_id: int) -> str:
    return f"build-{build_id}"


def fanout_job_id(plan_id: int) -> str:
    return f"fanout-plan-{plan_id}"


BATCH_PREFIX = "builds-"


def batch_job_id(build_ids: list[int]) -> str:
    return f"{BATCH_PREFIX}{build_ids[0]}-{uuid.uuid4().hex[:8]}"


def batch_key(queue_name: str, build_id: int) -> str:
    """Redis: the batch job a queued build went out in (the sweeper asks it if alive)."""
    return f"orbitpilot:{queue_name}:batched:{build_id}"


def _text(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


@dataclass(frozen=True)
class Call:
    """A job of another domain pushed after the commit that asked for it: an importable
    function's name, its arguments (ids only, never content), its job id."""

    function: str
    args: tuple[Any, ...]
    job_id: str
    description: str


class BuildQueue:
    """Pushes build and fan-out jobs (ids and modes only, never content) with the
    configured timeout and retries. ``connect`` gives the app's Redis client, ``settings``
    the engine's settings as they are now."""

    def __init__(self, connect: Callable[[], Redis],
                 settings: Callable[[], EngineSettings]) -> None:
        self._connect = connect
        self._settings = settings

    @property
    def settings(self) -> EngineSettings:
        return self._settings()

    @property
    def redis(self) -> Redis:
        return self._connect()

    def rq(self) -> Queue:
        return Queue(self.settings.queue_name, connection=self.redis,
                     default_timeout=self.settings.job_timeout)

    def enqueue_options(self) -> dict[str, Any]:
        settings = self.settings
        return {
            "job_timeout": settings.job_timeout,
            "retry": Retry(max=max(1, settings.max_attempts - 1),
                           interval=list(settings.retry_intervals)),
            "result_ttl": settings.result_ttl,
            "failure_ttl": settings.failure_ttl,
        }

    def push(self, jobs: Iterable[tuple[str, Any]]) -> int:
        """Push ``("build", build_id)``, ``("fanout", Fanout)`` and ``("call", Call)``
        jobs; how many were pushed. Several builds go out ``build_batch`` to a job
        (``jobs.builds.run_builds``), one build alone as ``run_build``. A Redis failure
        is logged by kind and left to the sweeper (the rows are the requests, safe in
        PostgreSQL)."""
        jobs = list(dict.fromkeys(jobs))
        if not jobs:
            return 0
        settings = self.settings
        options = self.enqueue_options()
        builds = [what for kind, what in jobs if kind == "build"]
        try:
            queue = self.rq()
            if len(builds) == 1:
                queue.enqueue("jobs.builds.run_build", builds[0],
                              job_id=build_job_id(builds[0]),
                              description=f"memory build {builds[0]}", **options)
            else:
                size = max(1, settings.build_batch)
                for start in range(0, len(builds), size):
                    self._push_batch(queue, builds[start:start + size], options)
            for kind, what in jobs:
                if kind == "call":
                    queue.enqueue(what.function, *what.args, job_id=what.job_id,
                                  description=what.description, **options)
                elif kind == "fanout":
                    queue.enqueue("jobs.builds.fan_out_plan", what.plan_id, mode=what.mode,
                                  trigger=what.trigger, requested_by_id=what.requested_by_id,
                                  job_id=what.job_id, **options,
                                  description=f"plan {what.plan_id} build fan-out "
                                              f"({what.mode})")
        except Exception as exc:  # Redis down, refused, timed out
            log.warning("build queue unavailable (%s); %d job(s) left for the sweeper",
                        type(exc).__name__, len(jobs))
            return 0
        return len(jobs)

    def _push_batch(self, queue: Queue, build_ids: list[int], options: dict) -> None:
        job_id = batch_job_id(build_ids)
        # Written before the job: a sweeper reading in between finds it queued.
        keep = self.settings.job_timeout * 2 + self.settings.result_ttl
        with self.redis.pipeline(transaction=False) as pipe:
            for build_id in build_ids:
                pipe.set(batch_key(self.settings.queue_name, build_id), job_id, ex=keep)
            pipe.execute()
        queue.enqueue("jobs.builds.run_builds", list(build_ids), job_id=job_id,
                      description=f"memory builds {build_ids[0]}… ({len(build_ids)})",
                      **options)

    def lost(self, jobs: dict[str, Any]) -> list[Any]:
        """Of ``{job id: job}``, the jobs Redis no longer has alive (none when Redis
        cannot be reached: the sweeper tries again next time). A build that went out in
        a batch is alive while its batch job is. Two pipelined round trips, however
        many are asked about."""
        if not jobs:
            return []
        try:
            redis, ours = self.redis, self.settings.queue_name
            ids = list(jobs)
            with redis.pipeline(transaction=False) as pipe:
                for job_id in ids:
                    pipe.hmget(Job.key_for(job_id), "status", "origin")
                    build = job_id.removeprefix("build-")
                    pipe.get(batch_key(ours, int(build)) if build.isdigit() else "-")
                answers = pipe.execute()
            states = {job_id: answers[2 * n] for n, job_id in enumerate(ids)}
            batches = {job_id: _text(answers[2 * n + 1]) for n, job_id in enumerate(ids)}
            wanted = sorted({b for b in batches.values() if b})
            if wanted:
                with redis.pipeline(transaction=False) as pipe:
                    for batch in wanted:
                        pipe.hmget(Job.key_for(batch), "status", "origin")
                    states.update(zip((f"batch:{b}" for b in wanted), pipe.execute(),
                                      strict=True))

            def alive(state: Any) -> bool:
                # Only a job of this queue counts: another queue on the same Redis (a
                # test run's, a second deployment's) may reuse the id.
                status, origin = (_text(v) for v in (state or (None, None)))
                return origin == ours and status in _LIVE_JOB_STATES

            return [job for job_id, job in jobs.items()
                    if not alive(states[job_id])
                    and not (batches[job_id] and alive(states[f"batch:{batches[job_id]}"]))]
        except Exception as exc:
            log.warning("sweeper cannot reach the build queue (%s)", type(exc).__name__)
            return []


# Weak, so a dropped app's engine goes (the queue must not hold its app strongly).
_BOUND: weakref.WeakKeyDictionary[Engine, BuildQueue] = weakref.WeakKeyDictionary()


def _base(engine: Engine) -> Engine:
    # An engine made with ``execution_options`` proxies the one it was made from.
    return getattr(engine, "_proxied", engine)


def bind_queue(engine: Engine, queue: BuildQueue) -> None:
    """Jobs asked for in transactions on ``engine`` are pushed to ``queue`` at commit."""
    _BOUND[_base(engine)] = queue


def queue_for(session: Session) -> BuildQueue | None:
    """The queue bound to the engine ``session`` writes build rows with, if any."""
    try:
        bind = session.get_bind(mapper=MemoryBuild)
    except Exception:  # an app-bound session used outside its app: nothing to push to
        return None
    engine = getattr(bind, "engine", bind)
    return _BOUND.get(_base(engine)) if engine is not None else None
