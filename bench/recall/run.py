"""`make bench`'s recall figures (bench/README.md, "Recall"): recall@1 and @5 of full text alone, vectors alone
and hybrid (plugins_app/selectors/recall.py) over bench/recall/set.json, and the p50 of ingest's recall
(DbMemoryStore.recall, what the default engine's ingest runs) with each, on SQLite and, when one answers, on
PostgreSQL. Each database run is a child process with its own LIBREFANG_HOME (and a scratch PostgreSQL database).

  .venv/bin/python bench/recall/run.py [--rounds N] [--sqlite-only]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SET = REPO / "bench" / "recall" / "set.json"
PG = "postgres://postgres@127.0.0.1:5432"
MODES = {"text": '[embeddings]\nprovider = "none"\n', "vector": "", "hybrid": ""}


def measure(rounds: int) -> dict:
    """Runs in the child: the database is DATABASE_URL's (or a fresh SQLite file), already migrated."""
    sys.path.insert(0, str(REPO))
    import django
    django.setup()
    from plugins_app.home import config_cache, embedder, forget, home
    from plugins_app.selectors.memories import CANDIDATES_PER_RESULT, MemoryFilter, search
    from plugins_app.selectors.recall import recall, vector_ranking
    from plugins_app.services.memory import DbMemoryStore
    from plugins_app.services.vectors import VECTORS

    data = json.loads(SET.read_text())
    store = DbMemoryStore()
    ingest_ms: dict[str, list[float]] = {}
    for m in data["memories"]:
        store.remember(m["agent_id"], None, m["content"])
    VECTORS.flush(timeout=120)
    ids = {(m.agent_id, m.content): m.id for m in __import__("plugins_app.models").models.Memory.objects.all()}

    def ranked(mode: str, agent: str, query: str) -> list[int]:
        f = MemoryFilter(agent)
        if mode == "text":
            return [m.id for m, _ in search(f, query, 5)]
        if mode == "vector":
            emb = embedder()
            return [mid for mid, _ in vector_ranking(f, emb.embed([query])[0], emb.model, 5 * CANDIDATES_PER_RESULT)][:5]
        return [hit.memory.id for hit in recall(f, query, 5).hits]

    out = {"database": __import__("django.db").db.connection.vendor, "memories": len(ids),
           "queries": len(data["queries"]), "model": embedder().model}
    for mode, config in MODES.items():
        (home().config_path).write_text(config)
        forget()
        config_cache().get()
        hits1 = hits5 = 0
        for q in data["queries"]:
            found = ranked(mode, q["agent_id"], q["query"])
            want = ids[(q["agent_id"], q["expected"])]
            hits1 += found[:1] == [want]
            hits5 += want in found[:5]
        timings = ingest_ms.setdefault(mode, [])
        if mode != "vector":  # ingest recalls by text (embedder off) or hybrid; vector alone is no ingest mode
            for _ in range(rounds):
                for q in data["queries"]:
                    t0 = time.perf_counter()
                    store.recall(q["agent_id"], None, q["query"], 5)
                    timings.append((time.perf_counter() - t0) * 1000)
        out[mode] = {"recall_at_1": round(hits1 / len(data["queries"]), 3),
                     "recall_at_5": round(hits5 / len(data["queries"]), 3),
                     "ingest_p50_ms": round(statistics.median(timings), 3) if timings else None}
    return out


def child(database_url: str | None, rounds: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="recall-bench-") as tmp:
        env = {**os.environ, "LIBREFANG_HOME": str(Path(tmp) / "home"), "DJANGO_SETTINGS_MODULE":
               "librefang_site.settings", "LIBREFANG_DB": str(Path(tmp) / "bench.sqlite3")}
        env.pop("DATABASE_URL", None)
        if database_url:
            env["DATABASE_URL"] = database_url
        py = sys.executable
        subprocess.run([py, str(REPO / "manage.py"), "migrate", "-v", "0"], env=env, check=True, cwd=REPO)
        res = subprocess.run([py, __file__, "--child", "--rounds", str(rounds)], env=env, check=True, cwd=REPO,
                             capture_output=True, text=True)
        return json.loads(res.stdout.strip().splitlines()[-1])


def postgres_database():
    """A scratch database on the local PostgreSQL, or None when none answers."""
    try:
        import psycopg
        name = f"recall_bench_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(f"{PG}/postgres", autocommit=True, connect_timeout=2) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return name
    except Exception as exc:  # no driver, no server
        print(f"PostgreSQL skipped: {exc}", file=sys.stderr)
        return None


def drop(name: str) -> None:
    import psycopg
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def table(results: list[dict]) -> None:
    print(f"{'database':<11}{'mode':<8}{'recall@1':>9}{'recall@5':>9}{'ingest p50 ms':>15}")
    for r in results:
        for mode in MODES:
            m = r[mode]
            p50 = f"{m['ingest_p50_ms']:.3f}" if m["ingest_p50_ms"] is not None else "-"
            print(f"{r['database']:<11}{mode:<8}{m['recall_at_1']:>9.2f}{m['recall_at_5']:>9.2f}{p50:>15}")
    print(f"({results[0]['memories']} memories, {results[0]['queries']} queries, model {results[0]['model']})")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=int(3 * float(os.environ.get("BENCH_SCALE", "1"))) or 1)
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--sqlite-only", action="store_true")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.rounds)))
        return
    results = [child(None, args.rounds)]
    name = None if args.sqlite_only else postgres_database()
    if name:
        try:
            results.append(child(f"{PG}/{name}", args.rounds))
        finally:
            drop(name)
    table(results)
    out = REPO / "bench" / "results" / "recall.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
