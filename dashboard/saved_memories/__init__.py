"""Saved memories: what connected apps save through ``/v1/memories``, their API keys,
forget markers (erasure receipts) and the erasure VACUUM.

The front door of the rules, whoever calls them (the API, the MCP tools, the user's
pages, other domains): ``rules`` (scopes, refusals, checks, finding by id), ``listing``,
``editing`` (save, change), ``forgetting`` (soft delete, redact, hard delete, restore),
``receipts`` and ``reading`` (recall, export, status). Modules of this package import
those modules themselves."""

from dashboard.saved_memories.editing import Saved, change_memory, save_memory, update_memory
from dashboard.saved_memories.forgetting import (
    HELD_ALREADY,
    HELD_RESTORE,
    HELD_WITH_REPLACEMENT,
    REDACTED,
    forget_memory,
    restore_memory,
)
from dashboard.saved_memories.listing import (
    DEFAULT_PAGE_SIZE,
    MAX_PAGE_SIZE,
    Page,
    clamp_limit,
    decode_cursor,
    encode_cursor,
    list_memories,
)
from dashboard.saved_memories.reading import (
    MAX_RECALL_K,
    NO_MATCH,
    NOT_SURE,
    Recalled,
    export_memories,
    memory_dict,
    recall,
    recall_notice,
    status_of,
)
from dashboard.saved_memories.receipts import Receipt, find_receipt, receipt_of, receipts_of_memory
from dashboard.saved_memories.rules import (
    FORGET_MODES,
    GONE,
    MAX_CONTENT,
    MAX_METADATA_BYTES,
    MAX_REASON,
    NOT_FOUND,
    SCOPE_FOR_OPERATION,
    InvalidMemoryInput,
    MemoryBusy,
    MemoryConflict,
    MemoryGone,
    MemoryNotFound,
    ScopeMissing,
    Scopes,
    check_content,
    check_metadata,
    check_mode,
    check_reason,
    check_scope,
    check_source,
    find_memory,
    parse_memory_id,
)

__all__ = [
    "DEFAULT_PAGE_SIZE", "FORGET_MODES", "GONE", "HELD_ALREADY", "HELD_RESTORE",
    "HELD_WITH_REPLACEMENT", "MAX_CONTENT", "MAX_METADATA_BYTES", "MAX_PAGE_SIZE",
    "MAX_REASON", "MAX_RECALL_K", "NOT_FOUND", "NO_MATCH", "NOT_SURE", "REDACTED",
    "SCOPE_FOR_OPERATION", "recall_notice",
    "InvalidMemoryInput", "MemoryBusy", "MemoryConflict", "MemoryGone", "MemoryNotFound",
    "Page", "Receipt", "Recalled", "Saved", "ScopeMissing", "Scopes", "change_memory",
    "check_content", "check_metadata", "check_mode", "check_reason", "check_scope",
    "check_source", "clamp_limit", "decode_cursor", "encode_cursor", "export_memories",
    "find_memory", "find_receipt", "forget_memory", "list_memories", "memory_dict",
    "parse_memory_id", "recall", "receipt_of", "receipts_of_memory", "restore_memory",
    "save_memory", "status_of", "update_memory",
]
