"""Saved memories: what connected apps save through ``/v1/memories``, their API keys,
forget markers (erasure receipts) and the erasure VACUUM."""
