"""``flask mcp stdio``: the MCP server over stdin/stdout, for a local agent (Codex CLI,
VS Code) that starts a command, signed in with an API key from the environment."""

from __future__ import annotations

import logging
import sys

import click
from flask import current_app
from flask.cli import with_appcontext

from dashboard.memory import preload_embedder
from dashboard.saved_memories.models import MEMORY_SOURCES

KEY_VARIABLE = "ORBITPILOT_API_KEY"


@click.group("mcp", help="The MCP server for assistants (HTTP at /mcp; stdio here).")
def mcp_group() -> None:
    pass


@mcp_group.command("stdio")
@click.option("--source", type=click.Choice([s for s in MEMORY_SOURCES if s != "orbitpilot"]),
              default="api", show_default=True,
              help="what memories saved here name as their source (codex, copilot, …)")
@with_appcontext
def stdio(source: str) -> None:
    """Serve MCP on stdin/stdout with the API key in ORBITPILOT_API_KEY (never an
    argument: arguments show in the process list)."""
    from dashboard.connectors.mcp import build_server, from_api_key  # the SDK: only here

    raw = current_app.config["ORBITPILOT_API_KEY"]
    if not raw:
        raise click.ClickException(f"Set {KEY_VARIABLE} to an API key (create one on "
                                   "/settings/keys).")
    # stdout is the protocol: every log line goes to stderr.
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, force=True)
    principal = from_api_key(raw, source=source)
    # The model loads before the session starts, not at its first search.
    preload_embedder(current_app.config["EMBEDDER"])
    build_server(current_app._get_current_object(), principal).run("stdio")
