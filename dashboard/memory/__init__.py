"""The memory engine's front door: code outside ``dashboard/memory/`` imports this module
only (a test holds it so); the modules behind it are the engine's own.

- requests: ``request_build(s)``, the staff's, the user's own, ``build_for_change``;
- forgetting under the build lock: ``wait_for_builds``, ``forget_chunks``;
- reading: ``search_memory`` (``NothingToSearch``), ``preview_memory_build``,
  ``memory_status``;
- jobs: ``execute_build(s)``, ``abandon_build(s)``, the sweeper, the schedule, plan
  fan-outs (``apply_plan_change``), a model change, the truth check, ``index_user_ann``,
  pruning old build records and tombstones (for retention);
- what they run with: the queue (``defer_job``: another domain's ``Call`` after the
  commit), the embedders, the settings, the models, the chunker (``chunk_text``)."""

from dashboard.memory import changes as _changes  # noqa: F401  (registers the ORM listener)
from dashboard.memory.ann import IndexOutcome, index_user_ann
from dashboard.memory.bulk import PlanApplied, apply_plan_change
from dashboard.memory.chunking import chunk_text
from dashboard.memory.embedders import (
    OWN_CUT,
    Embedder,
    RecallCut,
    embedder_loaded,
    embedder_loads,
    embedder_model_name,
    get_embedder,
    match_distance,
    preload_embedder,
    recall_cut,
    warm_in_background,
)
from dashboard.memory.locks import BuildsBusy, count_item_chunks, forget_chunks, wait_for_builds
from dashboard.memory.maintenance import (
    fan_out_plan_builds,
    prune_build_records,
    prune_tombstones,
    request_scheduled_builds,
    sweep_builds,
)
from dashboard.memory.model_change import (
    ModelChange,
    model_change_progress,
    request_model_change_builds,
)
from dashboard.memory.models import (
    BUILD_MODES,
    BUILD_STATUSES,
    BUILD_TRIGGERS,
    RECORD_MODES,
    DeletedPart,
    MemoryBuild,
    MemoryChunk,
    MemoryState,
)
from dashboard.memory.pipeline import preview_memory_build
from dashboard.memory.queue import BuildQueue, Call, bind_queue
from dashboard.memory.requests import (
    BuildRequest,
    RateLimited,
    build_for_change,
    defer_job,
    request_build,
    request_builds,
    request_builds_by_staff,
    request_plan_builds_by_staff,
    request_user_update,
)
from dashboard.memory.runner import abandon_build, abandon_builds, execute_build, execute_builds
from dashboard.memory.search import (
    POSSIBLY_RELATED,
    RELEVANT,
    NothingToSearch,
    search_memory,
)
from dashboard.memory.settings import EngineSettings, settings_from
from dashboard.memory.status import BuildSummary, MemoryStatus, memory_status
from dashboard.memory.verify import KINDS as VIOLATION_KINDS
from dashboard.memory.verify import VerifyReport, last_verification, verify_memory

__all__ = [
    # requests
    "BuildRequest", "RateLimited", "build_for_change", "request_build", "request_builds",
    "request_builds_by_staff", "request_plan_builds_by_staff", "request_user_update",
    # forgetting
    "BuildsBusy", "count_item_chunks", "forget_chunks", "wait_for_builds",
    # reading
    "BuildSummary", "MemoryStatus", "NothingToSearch", "memory_status", "preview_memory_build",
    "search_memory",
    # jobs
    "IndexOutcome", "ModelChange", "PlanApplied", "abandon_build", "abandon_builds",
    "apply_plan_change", "execute_builds", "execute_build", "fan_out_plan_builds",
    "index_user_ann", "prune_build_records", "prune_tombstones",
    "model_change_progress", "request_model_change_builds", "request_scheduled_builds",
    "sweep_builds", "VIOLATION_KINDS", "VerifyReport", "last_verification", "verify_memory",
    # what they run with
    "BUILD_MODES", "RECORD_MODES", "chunk_text",
    "BUILD_STATUSES", "BUILD_TRIGGERS", "OWN_CUT", "BuildQueue", "Embedder",
    "Call", "DeletedPart", "EngineSettings", "MemoryBuild", "MemoryChunk", "defer_job",
    "MemoryState", "RecallCut", "bind_queue", "embedder_model_name", "get_embedder",
    "match_distance", "preload_embedder", "recall_cut", "settings_from",
    "embedder_loaded", "embedder_loads", "warm_in_background",
    "RELEVANT", "POSSIBLY_RELATED",
]
