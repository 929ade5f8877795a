"""Blinks: short notes a user keeps (and replies caught with **Catch**)."""
