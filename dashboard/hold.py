"""Hold the embedded servers for the length of ``scripts/run``.

``python -m dashboard.hold`` starts them (unless DATABASE_URL and REDIS_URL are both set)
and holds them until SIGTERM/SIGINT; ``--wait`` returns once they answer."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from dashboard.embedded import default_root, get_services


def _wanted() -> dict[str, bool]:
    """Which embedded servers this set-up uses: those whose URL is not configured."""
    return {"postgres": not os.environ.get("DATABASE_URL"),
            "valkey": not os.environ.get("REDIS_URL")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dashboard.hold")
    parser.add_argument("--wait", action="store_true", help="wait until the servers answer")
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    wanted = _wanted()
    if not any(wanted.values()):
        return 0
    services = get_services(default_root())
    if args.wait:
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            status = services.status()
            if status["holders"] and all(status[name] for name, on in wanted.items() if on):
                return 0
            time.sleep(0.2)
        print("embedded servers did not start; see instance/services/", file=sys.stderr)
        return 1

    def stop(signum, frame):  # noqa: ARG001
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    services.ensure(postgres=wanted["postgres"], redis=wanted["valkey"])
    print(f"==> embedded PostgreSQL and Valkey up under {services.root}", flush=True)
    try:
        while True:
            time.sleep(3600)
    finally:
        services.release()


if __name__ == "__main__":
    raise SystemExit(main())
