"""One sentence per source state. Every surface that says whether something is
remembered (Memory Status, the chat notice, the reply's honesty note) calls this, so they
can never disagree word for word.

Labels are written for a list ("Your profile", "Saved memories"); inside a sentence they
read as words ("…includes your profile."), so ``in_sentence`` lower-cases a label's first
letter unless its first word is a name ("Blinks", "OrbitPilot") or an acronym ("API"),
which keep their capitals wherever they stand."""

from __future__ import annotations

from dashboard.plans.services import Resolution, SourceResolution, SourceState
from dashboard.sources import get_source

CHAT_REMEMBERED = "Conversations are remembered so I can help you better"
GUEST_INVITATION = (
    "Nothing is remembered while you are signed out. Create a free account and "
    "OrbitPilot will remember what matters to you."
)

# Names that keep their capital at the start of a label as anywhere else. A word with a
# capital after its first letter ("OrbitPilot", "API") is a name by its spelling alone.
PROPER_NOUNS = frozenset({"Blink", "Blinks", "OrbitPilot", "ChatGPT", "Codex", "Copilot"})


def in_sentence(label: str) -> str:
    """A source's label as it reads inside a sentence: "Your profile" → "your profile",
    "Saved memories" → "saved memories", "Blinks" → "Blinks"."""
    first, _, _ = label.partition(" ")
    if not first or first in PROPER_NOUNS or first[1:] != first[1:].lower():
        return label
    return label[0].lower() + label[1:]


def join_labels(labels: list[str]) -> str:
    if not labels:
        return ""
    if len(labels) == 1:
        return labels[0]
    return f"{', '.join(labels[:-1])} and {labels[-1]}"


def days_phrase(days: int) -> str:
    return "day" if days == 1 else f"{days} days"


def _sources_phrase(count: int) -> str:
    return "no sources" if count == 0 else f"{count} source{'s' if count != 1 else ''}"


def state_sentence(source: SourceResolution, resolution: Resolution) -> str:
    """The reason, in plain words, that ``source`` is or is not remembered."""
    if source.state is SourceState.GUEST or resolution.plan is None:
        return GUEST_INVITATION
    plan = resolution.plan.name
    label = in_sentence(source.label)
    if source.state is SourceState.INCLUDED:
        if source.keep_days:
            return (f"Remembered: your {plan} plan keeps the last "
                    f"{days_phrase(source.keep_days)} of {label}.")
        return f"Remembered: your {plan} plan includes {label}."
    if source.state is SourceState.EVICTED_BY_CAP:
        cap = source.cap or 0
        if cap == 0 or not source.filled_by:
            return f"Not remembered on the {plan} plan: your plan includes {_sources_phrase(0)}."
        fillers = [in_sentence(get_source(k).label) for k in source.filled_by]
        if len(fillers) == 1:
            # "comes" or "come" would have to agree with the label ("your Blinks come").
            return (f"Not remembered on the {plan} plan: your plan includes "
                    f"{_sources_phrase(cap)}, and it goes to {fillers[0]}.")
        return (
            f"Not remembered on the {plan} plan: your plan includes {_sources_phrase(cap)}, "
            f"and {join_labels(fillers)} come first."
        )
    if source.state is SourceState.NOT_ASSIGNED_BY_ADMIN:
        return f"Not remembered on the {plan} plan: an administrator switched {label} off."
    # Off by default and no plan row: phrased so no verb has to agree with the label
    # ("your profile is", "saved memories are").
    return f"Not remembered on the {plan} plan: an administrator has not switched on {label}."


def source_sentence(resolution: Resolution, key: str) -> tuple[SourceResolution, str]:
    """One source's state and its sentence, as a page about that source shows them."""
    source = resolution.get(key)
    return source, state_sentence(source, resolution)
