"""Retention: plan windows with a preview, purges of soft-deleted memories past their
restore window (each with its receipt; a legal hold makes them wait), pruning of
operational records, and the periodic run that applies it all (``apply_retention``)."""

from dashboard.retention.services import (
    RETENTION_ACTOR,
    RetentionChanged,
    RetentionError,
    RetentionNotice,
    RetentionPreview,
    RetentionRun,
    aged_chunks,
    aged_sources,
    apply_retention,
    complete_released,
    parse_retention,
    preview_retention,
    purgeable,
    retention_fingerprint,
    retention_notice,
    set_retention,
)

__all__ = ["RETENTION_ACTOR", "RetentionChanged", "RetentionError", "RetentionNotice",
           "RetentionPreview", "RetentionRun", "aged_chunks", "aged_sources",
           "apply_retention", "complete_released", "parse_retention", "preview_retention",
           "purgeable", "retention_fingerprint", "retention_notice", "set_retention"]
