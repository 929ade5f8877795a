"""Walk the whole URL map (Flask-Admin included) as guest, user, support and admin with
malformed input: every answer is a 2xx, 3xx or 4xx, and no page, redirect or flashed message
shows exception text.

Every run visits every rule with each of its methods: its plausible cases, and a seeded
sample of its malformed ones (some of each kind), so runs differ and in time send them all.
The seed is in the report header and in every failure; ``--walk-seed N`` replays a run,
``--full-walk`` (scripts/full-walk) sends every case. Each test collects the failing cases
of one walk and reports them grouped by cause."""

from __future__ import annotations

import math
import random
import re
import traceback
import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote_to_bytes

import pytest
from flask import url_for
from sqlalchemy import select

from dashboard.auth.models import User
from dashboard.extensions import db
from dashboard.memory import MemoryBuild, get_embedder
from tests.conftest import csrf_from
from tests.factories import PASSWORD, make_plan, make_team, make_user

IDENTITIES = ("guest", "user", "support", "admin")
BIG = str(2**64)
INT4, INT8 = str(2**31), str(2**63)  # one past PostgreSQL's integer and bigint
NUL = "a\x00b"
LEAKS = ("Traceback", "psycopg", "sqlalchemy", "sqlalche.me", "[SQL:", "Failing row",
         "pbkdf2", "scrypt")
FILE_RULES = {"static", "admin.static"}
# The sample: of each rule's malformed cases, this share and at least this many (the whole
# walk sends about 31,800 requests per identity; the sample about 1,800).
SHARE = 0.02
AT_LEAST_GET, AT_LEAST_WRITE = 6, 8

QUERIES = (
    "id=abc", "id=-1", f"id={BIG}", "id=", "id=1.5", f"id={INT4}", f"id={INT8}",
    "page=-1", "page=abc", f"page={BIG}", "page=1000000", "page_size=-5", "page_size=100000",
    "sort=99", "sort=abc", "desc=7",
    "flt0_0=abc", "flt0_99=x", f"flt1_3={BIG}", "flt9_0=1",
    "search=%00", "search=%FF%FE", "url=//evil.example", "next=//evil.example",
    "name=nope&query=x", "name=plan&query=%00",
)
# Values for a filter of every kind the list has: strings, numbers out of range, lists.
FILTER_VALUES = ("abc", BIG, INT4, "-1", "", f"1,abc,{BIG}")
# Rule arguments other than files: one plausible value each, then malformed ones.
PLAUSIBLE_ARGS = {"export_type": ("csv", "xlsx"),
                  # Well-formed, but nobody's: the "not among yours" path of each view.
                  "memory_id": ("6f1c1a3e-4d7b-4b55-9a65-0c2f3f5d8e11",),
                  # The walking user's team (``world``), and an invitation nobody made.
                  "slug": ("walk-team",),
                  "token": ("opti_" + "w" * 43,)}
MALFORMED_ARGS = ("abc", BIG, "-1", "..%2F..%2Fpyproject.toml", "%00", "%FF%FE")
# File serving: path traversal and NUL only.
FILE_PATHS = ("../pyproject.toml", "%2e%2e/%2e%2e/pyproject.toml", "..%2F..%2Fpyproject.toml",
              "....//....//etc/passwd", "a%00b", "%00", "%FF")

# Every field the app's forms read (edit forms, sign-up, sign-in, inline list edits).
FIELDS = ("name", "slug", "description", "included_sources", "monthly_price_cents", "role",
          "plan", "active", "email", "password", "confirm", "display_name", "remember",
          "list_form_pk")
BAD_VALUES = ("abc", "-1", BIG, INT4, "", "1.5", "x" * 3000, NUL)
# Bodies a dict cannot hold: bytes that are not UTF-8, an overlong NUL.
RAW_BODIES = ("name=%FF%FE&slug=x", "email=%C0%80&password=x", "role=%ED%A0%80",
              "action=build_quick&rowid=%FF", "%FF=1")


@dataclass
class World:
    plan_id: int
    target_id: int
    build_id: int
    emails: dict[str, str]

    def id_for(self, endpoint: str) -> int:
        """A real record of the view the endpoint belongs to (a plan for the rest)."""
        blueprint = endpoint.partition(".")[0]
        return {"user": self.target_id, "builds": self.build_id}.get(blueprint, self.plan_id)


@dataclass
class Case:
    method: str
    endpoint: str
    url: str
    # Fields sent urlencoded, or as multipart/form-data; ``raw`` is an urlencoded body
    # sent as it is (after the CSRF token), for bytes a dict cannot hold.
    form: dict = field(default_factory=dict)
    multipart: bool = False
    raw: str = ""
    # The rule the case belongs to, and what is malformed in it ("" for a plausible case,
    # which every run sends): the sample takes some of each kind of each rule.
    rule: str = ""
    kind: str = ""

    def describe(self) -> str:
        shown = {k: (v if len(v) <= 40 else f"{v[:8]}...({len(v)} chars)")
                 if isinstance(v, str) else v for k, v in self.form.items()}
        return " ".join(filter(None, (
            self.method, self.url, self.form and f"data={shown!r}",
            self.multipart and "(multipart)", self.raw and f"body=csrf_token=...&{self.raw}")))


@pytest.fixture
def world(db_session) -> World:
    plan = make_plan(db_session, name="Walk plan")
    emails = {role: make_user(db_session, role=role, email=f"walk-{role}@example.test").email
              for role in ("user", "support", "admin")}
    target = make_user(db_session, plan=plan, email="walk-target@example.test")
    walker = db_session.scalars(select(User).where(User.email == emails["user"])).one()
    make_team(db_session, walker, slug="walk-team", name="Walk team", members={target: "member"})
    build = MemoryBuild(user_id=target.id, mode="full", trigger="admin", status="succeeded")
    db_session.add(build)
    # Committed (a savepoint released): a request that rolls back keeps these rows.
    db_session.commit()
    return World(plan_id=plan.id, target_id=target.id, build_id=build.id, emails=emails)


# -- the cases ------------------------------------------------------------------------------

def _fill(rule, raw: str) -> str:
    """The rule's path with every argument replaced by ``raw`` (already URL-encoded)."""
    return re.sub(r"<[^>]+>", raw, rule.rule)


def _static_file(app, endpoint: str) -> str:
    """A file the rule serves (the first by name)."""
    blueprint = endpoint.rpartition(".")[0]
    folder = Path(app.blueprints[blueprint].static_folder if blueprint else app.static_folder)
    return min(path.relative_to(folder).as_posix() for path in folder.rglob("*")
               if path.is_file())


def _paths(app, rule) -> Iterator[tuple[str, str]]:
    """The rule's paths, each with its kind: plausible ones ("") first, then malformed."""
    if rule.endpoint in FILE_RULES:
        yield url_for(rule.endpoint, filename=_static_file(app, rule.endpoint)), ""
        yield from ((_fill(rule, raw), "file") for raw in FILE_PATHS)
        return
    if not rule.arguments:
        yield url_for(rule.endpoint), ""
        return
    names = sorted(rule.arguments)

    def plausible(name: str) -> tuple:
        if name in PLAUSIBLE_ARGS:
            return PLAUSIBLE_ARGS[name]
        # An <int:…> argument gets numbers (one in range, one past PostgreSQL's integer).
        if type(rule._converters[name]).__name__ == "IntegerConverter":
            return (1, 2**31)
        return ("x",)

    for values in zip(*(plausible(name) for name in names), strict=False):
        yield url_for(rule.endpoint, **dict(zip(names, values, strict=True))), ""
    yield from ((_fill(rule, raw), "path") for raw in MALFORMED_ARGS)


def _filter_queries(app, endpoint: str) -> Iterator[str]:
    view = getattr(app.view_functions[endpoint], "__self__", None)
    # The names the view reads its filters by (indexes, or names with named_filter_urls).
    for key in getattr(view, "_filter_args", None) or ():
        for value in FILTER_VALUES:
            yield f"flt0_{key}={value}"


def _rules(app):
    return sorted(app.url_map.iter_rules(), key=lambda rule: (rule.rule, rule.endpoint))


def get_cases(app, world: World) -> Iterator[Case]:
    ids = (world.plan_id, world.target_id, world.build_id)
    for rule in _rules(app):
        # A plain visit, its own record, a page of a list: plausible on a plausible path.
        plausible = {"", f"id={world.id_for(rule.endpoint)}",
                     "page=0&page_size=20&sort=0&desc=1&search=walk"}
        filters = list(_filter_queries(app, rule.endpoint))
        is_filter = set(filters)
        for path, path_kind in _paths(app, rule):
            if rule.endpoint in FILE_RULES:
                yield Case("GET", rule.endpoint, path, rule=rule.rule, kind=path_kind)
                continue
            queries = ["", *QUERIES, *(f"id={i}" for i in ids),
                       f"id={world.id_for(rule.endpoint)}&url=//evil.example",
                       "page=0&page_size=20&sort=0&desc=1&search=walk", *filters]
            for query in queries:
                if path_kind:
                    kind = f"{path_kind}+query" if query else path_kind
                elif query in plausible:
                    kind = ""
                else:
                    kind = "filter" if query in is_filter else "query"
                yield Case("GET", rule.endpoint, f"{path}?{query}" if query else path,
                           rule=rule.rule, kind=kind)


def _plausible(world: World) -> dict[str, str]:
    """A form every view could accept: its own fields valid, the rest ignored."""
    unique = uuid.uuid4().hex[:12]
    return {"name": f"Walk {unique}", "slug": f"walk-{unique}", "description": "",
            "included_sources": "3", "monthly_price_cents": "0", "role": "user",
            "plan": str(world.plan_id), "active": "y", "email": f"walk-{unique}@example.test",
            "password": PASSWORD, "confirm": PASSWORD, "display_name": "Walker"}


def _forms(world: World, valid_id: int) -> Iterator[tuple[dict, str]]:
    """Forms, each with its kind ("" for the plausible one)."""
    valid = str(valid_id)
    yield from ((form, "form") for form in (
        {},
        {"csrf_token": "abc"},
        {"action": "build_quick", "rowid": "abc"},
        {"action": "build_quick", "rowid": BIG},
        {"action": "build_full", "rowid": INT4},
        {"action": "build_quick"},
        {"action": "build_full", "rowid": "-1"},
        {"action": "build_quick", "rowid": [valid, "abc"]},
        {"action": "build_quick", "rowid": valid},
        {"action": "nope", "rowid": valid},
        {"action": "delete", "rowid": valid},
        {"action": NUL, "rowid": valid},
        {"id": "abc"}, {"id": BIG}, {"id": "-1"}, {"id": ""}, {"id": valid},
        {"list_form_pk": "abc", "name": "x"},
        {"list_form_pk": BIG, "role": "admin"},
        {"list_form_pk": valid, "nope": "x"},
    ))
    yield _plausible(world), ""
    for name in FIELDS:
        yield {name: NUL}, "field"
        for bad in BAD_VALUES:
            yield {**_plausible(world), name: bad}, "field"


def post_cases(app, world: World) -> Iterator[Case]:
    """POSTs, and the rules' other writes (the API's PATCH and DELETE)."""
    for rule in _rules(app):
        if not rule.methods - {"GET", "HEAD", "OPTIONS"}:
            continue
        valid = world.id_for(rule.endpoint)
        path, _ = next(_paths(app, rule))  # a plausible path (arguments filled in)
        at = f"{path}?id={valid}"
        if "POST" in rule.methods:
            for query in ("", "id=abc", f"id={BIG}", "id=-1", "url=//evil.example",
                          f"id={valid}&url=//evil.example"):
                yield Case("POST", rule.endpoint, f"{path}?{query}" if query else path,
                           rule=rule.rule, kind="query" if query else "")
            for form, kind in _forms(world, valid):
                yield Case("POST", rule.endpoint, at, form, rule=rule.rule, kind=kind)
            for name in ("name", "email", "role"):
                yield Case("POST", rule.endpoint, at, {**_plausible(world), name: NUL},
                           multipart=True, rule=rule.rule, kind="multipart")
            for raw in RAW_BODIES:
                yield Case("POST", rule.endpoint, at, raw=raw, rule=rule.rule, kind="raw")
        for method in sorted(rule.methods - {"GET", "HEAD", "OPTIONS", "POST"}):
            for other, kind in _paths(app, rule):
                yield Case(method, rule.endpoint, other, rule=rule.rule, kind=kind)
            for raw in RAW_BODIES:
                yield Case(method, rule.endpoint, at, raw=raw, rule=rule.rule, kind="raw")


# -- the sample -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Sample:
    """Which cases a walk sends: every plausible one, and of each rule's malformed ones a
    seeded sample, taken round the kinds in turn; all of them when ``seed`` is None."""

    seed: int | None

    def pick(self, cases: list[Case], walk: str) -> list[Case]:
        if self.seed is None:
            return cases
        # Seeded by the walk too: replaying one test (-k) sends the cases it sent before.
        rng = random.Random(f"{self.seed} {walk}")
        keep: list[int] = []
        pools: dict[tuple, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
        for index, case in enumerate(cases):
            if case.kind:
                pools[case.method, case.endpoint, case.rule][case.kind].append(index)
            else:
                keep.append(index)
        for (method, _, _), kinds in pools.items():
            total = sum(map(len, kinds.values()))
            at_least = AT_LEAST_GET if method == "GET" else AT_LEAST_WRITE
            budget = min(total, max(at_least, math.ceil(SHARE * total)))
            queues = [rng.sample(indexes, len(indexes)) for indexes in kinds.values()]
            rng.shuffle(queues)
            while budget:
                for queue in queues:
                    if queue and budget:
                        keep.append(queue.pop())
                        budget -= 1
        return [cases[index] for index in sorted(keep)]

    def replay(self) -> str:
        if self.seed is None:
            return "the full walk (--full-walk): replay with ./scripts/full-walk"
        return (f"walk seed {self.seed}: replay with ./scripts/test tests/test_url_walk.py "
                f"--walk-seed {self.seed}")


@pytest.fixture
def sample(request) -> Sample:
    config = request.config
    return Sample(None if config.getoption("full_walk") else config.getoption("walk_seed"))


# -- the walker -----------------------------------------------------------------------------

def _address() -> str:
    """A client address of its own: failed sign-ins are throttled per address, on a Redis
    other runs share."""
    return f"2001:db8::{uuid.uuid4().hex[:4]}:{uuid.uuid4().hex[:4]}"


def _frames(exc: BaseException, count: int = 6) -> str:
    frames = traceback.extract_tb(exc.__traceback__)[-count:]
    return " <- ".join(f"{_short(f.filename)}:{f.lineno} in {f.name}" for f in reversed(frames))


def _short(filename: str) -> str:
    path = Path(filename)
    for marker in ("site-packages", "dashboard", "tests"):
        if marker in path.parts:
            return "/".join(path.parts[path.parts.index(marker) + (marker == "site-packages"):])
    return filename


class Walker:
    def __init__(self, client, auth, world: World, identity: str) -> None:
        self.client, self.auth, self.world, self.identity = client, auth, world, identity
        self.failures: dict[str, list[str]] = defaultdict(list)
        self.count = 0
        self.token = ""
        client.environ_base["REMOTE_ADDR"] = _address()

    def start(self) -> None:
        if self.identity != "guest":
            response = self.auth.login(self.world.emails[self.identity])
            assert response.status_code == 302, f"{self.identity} could not sign in"
        self.token = csrf_from(self.client, "/auth/signin" if self.identity == "guest" else "/")

    def walk(self, cases) -> None:
        for case in cases:
            self.send(case)

    def send(self, case: Case) -> None:
        self.count += 1
        path, _, _ = case.url.partition("?")
        overrides = {"PATH_INFO": unquote_to_bytes(path).decode("latin-1")}
        if case.endpoint == "auth.signin":
            overrides["REMOTE_ADDR"] = _address()
        data: dict | str | None = None
        content_type = "multipart/form-data" if case.multipart else None
        if case.raw:
            data = f"csrf_token={self.token}&{case.raw}"
            content_type = "application/x-www-form-urlencoded"
        elif case.method != "GET":
            data = {"csrf_token": self.token, **case.form}
        try:
            response = self.client.open(case.url, method=case.method, data=data,
                                        content_type=content_type,
                                        environ_overrides=overrides)
        except Exception as exc:
            db.session.rollback()
            self.fail(f"{type(exc).__module__}.{type(exc).__name__} at {_frames(exc, 1)}",
                      case, f"{type(exc).__name__}: {str(exc)[:200]!r}\n      {_frames(exc)}")
            self.keep_identity(case)
            return
        if response.status_code >= 500:
            self.fail(f"HTTP {response.status_code}", case, "")
        self.check_text(case, response.get_data(as_text=True), "the page")
        self.check_text(case, response.headers.get("Location", ""), "the redirect")
        self.keep_identity(case)

    def check_text(self, case: Case, text: str, where: str) -> None:
        lowered = text.lower()
        for needle in LEAKS:
            at = lowered.find(needle.lower())
            if at >= 0:
                self.fail(f"{needle!r} in {where}", case, repr(text[max(0, at - 80):at + 120]))

    def keep_identity(self, case: Case) -> None:
        """Read (and consume) flashed messages, and undo a sign-in or a sign-out the
        walk caused, so every case runs as the identity the test names."""
        signed_in = self.identity != "guest"
        with self.client.session_transaction() as session:
            flashes = session.pop("_flashes", [])
            user_id = session.get("_user_id")
            if not signed_in and user_id is not None:
                for key in ("_user_id", "_fresh", "_id"):
                    session.pop(key, None)
        for _, message in flashes:
            self.check_text(case, str(message), "a flashed message")
        if signed_in and user_id is None:
            self.start()

    def fail(self, cause: str, case: Case, detail: str) -> None:
        self.failures[cause].append(
            f"  {self.identity}: {case.describe()}" + (f"\n      {detail}" if detail else ""))

    def report(self, sample: Sample, total: int) -> str:
        lines = [f"{sum(map(len, self.failures.values()))} of {self.count} requests "
                 f"(of {total} cases) failed as {self.identity}, in {len(self.failures)} "
                 f"cause(s); {sample.replay()}"]
        for cause, cases in sorted(self.failures.items()):
            lines += [f"\n{cause} ({len(cases)}):", *cases]
        return "\n".join(lines)


def _walk(app, client, auth, world: World, identity: str, make_cases,
          sample: Sample) -> None:
    # As a served app: the run command's workers load the embedder before they serve (a
    # process that has not says "warming", 503, on /healthz: tests/test_security.py).
    get_embedder(app.config["EMBEDDER"])
    walker = Walker(client, auth, world, identity)
    walker.start()
    with app.test_request_context():  # url_for
        cases = list(make_cases(app, world))
    walker.walk(sample.pick(cases, f"{make_cases.__name__} {identity}"))
    if walker.failures:
        pytest.fail(walker.report(sample, len(cases)), pytrace=False)


@pytest.mark.parametrize("identity", IDENTITIES)
def test_every_get_answers_without_an_error(app, client, auth, world, identity, sample):
    _walk(app, client, auth, world, identity, get_cases, sample)


@pytest.mark.parametrize("identity", IDENTITIES)
def test_every_post_answers_without_an_error(app, client, auth, world, identity, sample):
    _walk(app, client, auth, world, identity, post_cases, sample)
