"""``python -m dashboard.embedded.guard ROOT``: stops the embedded servers under ROOT once
no live process holds them (see ``EmbeddedServices.guard``). Started by ``ensure``. It
stays small: nothing in ``dashboard.embedded`` imports Flask or the app."""

from __future__ import annotations

import signal
import sys

from dashboard.embedded.services import EmbeddedServices


def main(argv: list[str]) -> int:
    # Its own session already keeps a terminal's Ctrl+C away; a hang-up must not end it.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    EmbeddedServices(argv[0]).guard()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
