"""Every action and mode the audit log records, with the words the staff console shows
for them: the log's filters offer these, and a test holds them equal to the code's
``record_event`` calls (a new audited action is added here too)."""

from __future__ import annotations

ACTIONS: dict[str, str] = {
    "api_key.create": "API key created",
    "api_key.grant": "API key granted hard delete",
    "api_key.revoke": "API key revoked",
    "assignment.set": "Source assignment changed",
    "build.request": "Build requested for a user",
    "build.request_plan": "Builds requested for a plan",
    "export.download": "Export downloaded",
    "export.ready": "Export made",
    "export.request": "Export asked for",
    "legal_hold.keep_version": "Edit under a legal hold: the replaced text kept",
    "legal_hold.place": "Legal hold placed",
    "legal_hold.release": "Legal hold released",
    "legal_hold.versions_released": "Texts kept by an ended legal hold deleted",
    "memory.create": "Memory saved",
    "memory.update": "Memory changed",
    "memory.soft_delete": "Memory forgotten (soft delete)",
    "memory.redact": "Memory redacted",
    "memory.hard_delete": "Memory hard-deleted",
    "memory.restore": "Memory restored",
    "memory.verify": "Truth check found stored chunks to repair",
    "message.remember_toggle": "Message remember switch",
    "oauth.client_register": "App registered",
    "oauth.deny": "App access denied",
    "oauth.grant": "App connected",
    "oauth.grant_hard_delete": "App granted hard delete",
    "oauth.revoke": "App disconnected",
    "oauth.token_issue": "App token issued",
    "oauth.token_refresh": "App token refreshed",
    "oauth.token_revoke": "App token revoked",
    "plan.cap": "Plan cap changed",
    "plan.change_applied": "Plan change applied to its users",
    "plan.create": "Plan created",
    "plan.retention": "Plan retention changed",
    "plan.update": "Plan changed",
    "retention.apply": "Retention applied",
    "user.create": "User created",
    "user.update": "User changed",
}

MODES: dict[str, str] = {
    "soft_delete": "Soft delete",
    "redact": "Redact",
    "hard_delete": "Hard delete",
    "restore": "Restore",
    "quick": "Quick update",
    "full": "Full rebuild",
}
