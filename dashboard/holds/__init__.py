"""Legal holds: while one holds a user, nothing of theirs is purged or erased for good
(a soft delete still stops recall at once); erasures asked for meanwhile wait as pending
receipts and complete when it ends (``dashboard.retention`` completes them); an edit of a
Blink or a profile fact keeps the text it replaced until then (``keep_held_version``)."""

from dashboard.holds.models import HeldVersion, LegalHold
from dashboard.holds.services import (
    HeldByLaw,
    HoldError,
    active_hold,
    held_users,
    held_versions_of,
    hold_condition,
    holds_of,
    is_held,
    keep_held_version,
    place_hold,
    refuse_while_held,
    release_ended_versions,
    release_hold,
)

__all__ = ["HeldByLaw", "HeldVersion", "HoldError", "LegalHold", "active_hold", "held_users",
           "held_versions_of", "hold_condition", "holds_of", "is_held", "keep_held_version",
           "place_hold", "refuse_while_held", "release_ended_versions", "release_hold"]
