"""axe-core in the browser tests: the version pinned here, fetched once from the npm
registry (``npm pack``) into the virtualenv (or taken from ``$AXE_CORE_JS``), injected into
a page and run for the WCAG 2.1 A and AA rules."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
from functools import cache
from pathlib import Path

from tests.browser.checks import FITS, UNLABELLED

AXE_VERSION = "4.14.1"
WCAG_AA = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]


@cache
def axe_source() -> str:
    given = os.environ.get("AXE_CORE_JS")
    if given:
        return Path(given).read_text()
    cached = Path(sys.prefix) / "share" / f"axe-core-{AXE_VERSION}" / "axe.min.js"
    if not cached.exists():
        with tempfile.TemporaryDirectory() as folder:
            subprocess.run(["npm", "pack", f"axe-core@{AXE_VERSION}", "--silent"], cwd=folder,
                           check=True, capture_output=True, timeout=300)
            with tarfile.open(Path(folder) / f"axe-core-{AXE_VERSION}.tgz") as archive:
                member = archive.extractfile("package/axe.min.js")
                assert member is not None
                data = member.read()
        cached.parent.mkdir(parents=True, exist_ok=True)
        partial = cached.with_suffix(".part")
        partial.write_bytes(data)
        partial.replace(cached)  # whole or not at all
    return cached.read_text()


def violations(driver) -> list[dict]:
    """axe's WCAG 2.1 AA violations of the page the driver shows: rule, impact, and where."""
    driver.execute_script(axe_source())
    found = driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "axe.run(document, {runOnly: {type: 'tag', values: arguments[0]}})"
        ".then(r => done(r.violations.map(v => ({id: v.id, impact: v.impact,"
        " nodes: v.nodes.slice(0, 3).map(n => n.target.join(' ') + ' :: ' +"
        " (n.failureSummary || '').slice(0, 160))}))))"
        ".catch(e => done([{id: 'axe-error', impact: 'critical', nodes: [String(e)]}]));",
        WCAG_AA)
    return found


def checked(driver, found: dict, name: str) -> None:
    """axe's violations, unlabelled controls and overflow of the page the driver shows,
    kept in ``found`` by ``name``."""
    problems = [(v["id"], v["impact"], v["nodes"]) for v in violations(driver)]
    unlabelled = driver.execute_script(UNLABELLED)
    if unlabelled:
        problems.append(("unlabelled", unlabelled))
    if not driver.execute_script(FITS):
        problems.append(("wider than the screen", driver.current_url))
    if problems:
        found[name] = problems
