"""A person's role, and which roles are staff: the one place that says so (the audit log,
the staff console and the account model all read it here)."""

ROLES = ("user", "support", "admin")
STAFF_ROLES = ("support", "admin")
