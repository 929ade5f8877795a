"""Legal holds: while one holds a user, nothing of theirs is purged or erased for good
(a soft delete still stops recall at once); erasures asked for meanwhile wait as pending
receipts and complete when it ends (``dashboard.retention`` completes them)."""

from dashboard.holds.models import HeldVersion, LegalHold
from dashboard.holds.services import (
    HeldByLaw,
    HoldError,
    active_hold,
    held_users,
    hold_condition,
    holds_of,
    is_held,
    place_hold,
    refuse_while_held,
    release_hold,
)

__all__ = ["HeldByLaw", "HeldVersion", "HoldError", "LegalHold", "active_hold", "held_users",
           "hold_condition", "holds_of", "is_held", "place_hold", "refuse_while_held",
           "release_hold"]
