"""xmemo: memories saved by connected apps through ``/v1/memories``, API keys, forget markers."""
