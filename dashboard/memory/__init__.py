"""Memory chunks, build records and the user's Memory Status page."""
