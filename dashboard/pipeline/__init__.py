"""The memory build pipeline: extract → chunk → hash → embed → swap (§6)."""
