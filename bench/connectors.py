"""Connectors benchmark: do pages get slower with /mcp served beside them, and what does
a tool call cost over the REST call it wraps?

    .venv/bin/python bench/connectors.py              # 60 page loads, 60 calls each
    .venv/bin/python bench/connectors.py --loads 20

On a database of its own (dropped afterwards unless --keep), served by a real HTTP
server in this process: a user with 200 saved memories (built once), an API key and a
connected app's token. It prints page latencies (home, chat, Memory Status) before /mcp
was ever called, once it runs (idle), and while a client keeps calling it; and search
over MCP against search over REST, as medians and ratios. Nothing here passes or fails."""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import anyio  # noqa: E402
import httpx2  # noqa: E402
from mcp import ClientSession  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from sqlalchemy import select  # noqa: E402
from werkzeug.security import generate_password_hash  # noqa: E402
from werkzeug.serving import WSGIRequestHandler, make_server  # noqa: E402

from bench._setup import PASSWORD, drop_database, fresh_database, migrated_app, ms  # noqa: E402
from dashboard.extensions import db  # noqa: E402

DATABASE = "orbitpilot_bench_connectors"
QUEUE = "builds-bench-connectors"
EMAIL = "connectors@bench.test"
PAGES = ("/", "/orbitpilot/", "/memory/status")


class Quiet(WSGIRequestHandler):
    def log_request(self, *args, **kwargs) -> None:
        pass


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loads", type=int, default=60, help="loads per page, calls per kind")
    parser.add_argument("--keep", action="store_true", help="keep the bench database")
    return parser.parse_args()


def setup():
    from dashboard import saved_memories as memories
    from dashboard.audit.services import Actor
    from dashboard.auth.models import User
    from dashboard.connectors import services as connections
    from dashboard.embedded import OWNER_ROLE
    from dashboard.memory import MemoryBuild, execute_build, get_embedder, settings_from
    from dashboard.saved_memories.keys import create_key

    urls, admin = fresh_database(DATABASE)
    app = migrated_app({
        "SQLALCHEMY_DATABASE_URI": urls.database_url(DATABASE),
        "MIGRATIONS_DATABASE_URI": urls.database_url(DATABASE, OWNER_ROLE),
        "REDIS_URL": urls.redis, "BUILD_QUEUE": QUEUE, "SERVER_NAME": None,
        "API_RATE_LIMIT": "1000000 per minute", "OAUTH_RATE_LIMIT": "1000000 per minute"})
    server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=Quiet)
    base = f"http://127.0.0.1:{server.server_port}"
    with app.app_context():
        user = User(email=EMAIL, display_name="Bench", password_hash=generate_password_hash(
            PASSWORD, method="pbkdf2:sha256:1000"))
        db.session.add(user)
        db.session.flush()
        for i in range(200):
            memories.save_memory(db.session, owner=user, content=f"Fact {i}: prefers seat "
                                 f"{i % 30} on flight {i}.", actor=Actor.of(user))
        _, raw_key = create_key(db.session, owner=user, name="bench",
                                scopes=["memory:read"], actor=Actor.of(user))
        client, _ = connections.register_client(db.session, {
            "client_name": "Bench app", "redirect_uris": ["http://127.0.0.1:9/cb"],
            "token_endpoint_auth_method": "none"})
        grant = connections.consent(db.session, user=user, client=client,
                                    scopes=["memory:read"], resource=f"{base}/mcp",
                                    allowed=True)
        token = connections.new_secret(connections.ACCESS_PREFIX)
        connections.store_tokens(db.session, grant, access=token, refresh=None,
                                 scopes=["memory:read"],
                                 lifetimes=connections.Lifetimes(access=timedelta(hours=2)))
        db.session.commit()
        settings = settings_from(app.config)
        build_id = db.session.scalar(select(MemoryBuild.id).where(
            MemoryBuild.user_id == user.id, MemoryBuild.status == "queued"))
        execute_build(db.engine, build_id, settings=settings,
                      embedder=get_embedder(settings.embedder))
        db.session.remove()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return app, server, base, raw_key, token, admin


def signed_in(base: str) -> httpx2.Client:
    http = httpx2.Client(base_url=base, timeout=30)
    page = http.get("/auth/signin").text
    csrf = page.split('name="csrf_token"')[1].split('value="')[1].split('"')[0]
    http.post("/auth/signin", data={"email": EMAIL, "password": PASSWORD, "csrf_token": csrf})
    return http


def timed(call: Callable[[], object], loads: int) -> list[float]:
    call()  # warm
    spent = []
    for _ in range(loads):
        started = time.perf_counter()
        call()
        spent.append(time.perf_counter() - started)
    return spent


def page_medians(http: httpx2.Client, loads: int) -> dict[str, float]:
    return {path: statistics.median(timed(lambda p=path: http.get(p), loads))
            for path in PAGES}


async def mcp_searches(base: str, token: str, loads: int, stop: threading.Event | None = None
                       ) -> list[float]:
    spent: list[float] = []
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                                  timeout=60) as http, \
            streamable_http_client(f"{base}/mcp", http_client=http) as (read, write, *_), \
            ClientSession(read, write) as session:
        await session.initialize()
        count = 0
        while (stop is None and count <= loads) or (stop is not None and not stop.is_set()):
            started = time.perf_counter()
            await session.call_tool("search_memory", {"query": "seat on a flight", "k": 5})
            spent.append(time.perf_counter() - started)
            count += 1
    return spent[1:]


def main() -> None:
    args = parse_args()
    app, server, base, raw_key, token, admin = setup()
    try:
        browser = signed_in(base)
        before = page_medians(browser, args.loads)
        anyio.run(lambda: mcp_searches(base, token, 1))  # /mcp started, then idle
        idle = page_medians(browser, args.loads)
        stop = threading.Event()
        background = threading.Thread(target=lambda: anyio.run(
            lambda: mcp_searches(base, token, 0, stop)), daemon=True)
        background.start()
        time.sleep(1.0)
        beside = page_medians(browser, args.loads)
        stop.set()
        background.join(timeout=30)
        rest = httpx2.Client(base_url=base, headers={"X-API-Key": raw_key}, timeout=30)
        rest_calls = timed(lambda: rest.post("/v1/memories/search", json={
            "query": "seat on a flight", "k": 5}), args.loads)
        mcp_calls = anyio.run(lambda: mcp_searches(base, token, args.loads))
        print(f"page loads, median of {args.loads}: before /mcp was ever called | /mcp "
              "started, idle | while a client in this process calls it without pause (the "
              "same 2 cores and, here, the same interpreter):")
        for path in PAGES:
            print(f"  {path:<16} {ms(before[path]):>10} | {ms(idle[path]):>10} "
                  f"×{idle[path] / before[path]:.2f} | {ms(beside[path]):>10} "
                  f"×{beside[path] / before[path]:.2f}")
        rest_median, mcp_median = statistics.median(rest_calls), statistics.median(mcp_calls)
        print(f"search, median of {args.loads}: REST {ms(rest_median)}, MCP tool call "
              f"{ms(mcp_median)} (×{mcp_median / rest_median:.2f}, "
              f"+{ms(mcp_median - rest_median)})")
    finally:
        server.shutdown()
        with app.app_context():
            db.engine.dispose()
        if not args.keep:
            drop_database(admin, DATABASE)


if __name__ == "__main__":
    main()
