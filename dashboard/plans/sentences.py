"""One sentence per source state (§4). Every surface that says whether something is
remembered (Memory Status, the chat notice, the reply's honesty note) calls this, so they
can never disagree word for word."""

from __future__ import annotations

from dashboard.plans.services import Resolution, SourceResolution, SourceState
from dashboard.sources import get_source

CHAT_REMEMBERED = "Conversations are remembered so I can help you better"
GUEST_INVITATION = (
    "Nothing is remembered while you are signed out. Create a free account and "
    "OrbitPilot will remember what matters to you."
)


def join_labels(labels: list[str]) -> str:
    if not labels:
        return ""
    if len(labels) == 1:
        return labels[0]
    return f"{', '.join(labels[:-1])} and {labels[-1]}"


def _sources_phrase(count: int) -> str:
    return "no sources" if count == 0 else f"{count} source{'s' if count != 1 else ''}"


def state_sentence(source: SourceResolution, resolution: Resolution) -> str:
    """The reason, in plain words, that ``source`` is or is not remembered."""
    if source.state is SourceState.GUEST or resolution.plan is None:
        return GUEST_INVITATION
    plan = resolution.plan.name
    label = source.label
    if source.state is SourceState.INCLUDED:
        return f"Remembered: your {plan} plan includes {label}."
    if source.state is SourceState.EVICTED_BY_CAP:
        cap = source.cap or 0
        if cap == 0 or not source.filled_by:
            return f"Not remembered on the {plan} plan: your plan includes {_sources_phrase(0)}."
        fillers = join_labels([get_source(k).label for k in source.filled_by])
        verb = "comes" if len(source.filled_by) == 1 else "come"
        return (
            f"Not remembered on the {plan} plan: your plan includes {_sources_phrase(cap)}, "
            f"and {fillers} {verb} first."
        )
    if source.state is SourceState.NOT_ASSIGNED_BY_ADMIN:
        return f"Not remembered on the {plan} plan: an administrator switched {label} off."
    return (
        f"Not remembered on the {plan} plan: {label} is off unless an administrator "
        "switches it on."
    )
