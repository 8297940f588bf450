"""CPU per batch of the invocation writer (plugins_app/services/recording.py `record_now`, run by the worker's
`DbInvocationSink` thread), by batch size, against a fresh SQLite database or, with --pg, a fresh PostgreSQL
database (created and dropped here; PG_URL as in the Makefile).

Each batch is what a warm worker records: one plugin, calls alternating over two hooks, one in ten failed, one in
five from the test console, started "now" (so the minute and hour rows already exist after the warm-up, as in a
running worker). CPU is time.process_time (this process, the database driver included; SQLite runs in-process,
PostgreSQL's server CPU is not counted) and wall time per batch, median of the rounds; `prune_traces` is timed
apart (it runs once every PRUNE_EVERY recorded calls).

--impl FILE loads `record_now` from another copy of recording.py (e.g. `git show main:plugins_app/services/recording.py
> /tmp/recording_main.py`), so two versions can be measured back to back in one process on the same database.

    .venv/bin/python bench/recording_write.py [--pg] [--batches N] [--rounds R] [--impl FILE ...]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SIZES = (1, 3, 20)
PG_URL = os.environ.get("PG_URL", "postgres://postgres@127.0.0.1:5432/postgres")


def setup(tmp: Path, pg_db: str | None) -> None:
    os.environ.update({"DJANGO_SETTINGS_MODULE": "librefang_site.settings", "LIBREFANG_HOME": str(tmp / "home"),
                       "LIBREFANG_DB": str(tmp / "bench.sqlite3"),
                       "LIBREFANG_REDIS_PREFIX": f"lfbench-{uuid.uuid4().hex[:8]}"})
    os.environ.pop("DATABASE_URL", None)
    if pg_db:
        os.environ["DATABASE_URL"] = PG_URL.rsplit("/", 1)[0] + "/" + pg_db
    (tmp / "home").mkdir()
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", "--noinput", verbosity=0)


def pg_admin(sql: str) -> None:
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(sql)


def make_batch(size: int, rng: random.Random) -> list:
    from engine.ports import AGENT, TEST_CONSOLE, Invocation

    now = time.time()
    return [Invocation(trace_id=uuid.uuid4().hex[:16], plugin="bench_py", hook=("ingest", "after_turn")[n % 2],
                       agent_id=f"agent-{n % 5}", started_at=now - 0.01 * n, elapsed_ms=rng.lognormvariate(2.5, 0.6),
                       ok=rng.random() > 0.1, error="boom" if rng.random() < 0.1 else None,
                       input_preview='{"message": "hello"}', output_preview='{"type": "ok"}',
                       origin=TEST_CONSOLE if rng.random() < 0.2 else AGENT)
            for n in range(size)]


def load_impl(path: str | None):
    if path is None:
        from plugins_app.services import recording

        return recording
    spec = importlib.util.spec_from_file_location(f"recording_{uuid.uuid4().hex[:6]}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def measure(impl, size: int, batches: int, rng: random.Random) -> dict:
    from django.db import connection

    for _ in range(5):  # warm-up: rows exist, statements cached as in a running worker
        impl.record_now(make_batch(size, rng))
    cpu, wall = [], []
    queries_before = len(connection.queries)
    for _ in range(batches):
        batch = make_batch(size, rng)
        c0, w0 = time.process_time(), time.perf_counter()
        impl.record_now(batch)
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    queries = (len(connection.queries) - queries_before) / batches if connection.force_debug_cursor else None
    return {"size": size, "cpu_ms_per_batch": round(statistics.median(cpu) * 1000, 3),
            "cpu_ms_mean": round(statistics.fmean(cpu) * 1000, 3),
            "wall_ms_per_batch": round(statistics.median(wall) * 1000, 3), "queries_per_batch": queries}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pg", action="store_true")
    ap.add_argument("--batches", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--impl", action="append", default=None, help="recording.py copies to compare (default: ours)")
    ap.add_argument("--count-queries", action="store_true", help="one extra pass counting SQL statements")
    args = ap.parse_args()
    pg_db = f"lfrecbench_{os.getpid()}" if args.pg else None
    if pg_db:
        pg_admin(f"CREATE DATABASE {pg_db}")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            setup(Path(tmp), pg_db)
            from django.db import connection

            impls = {path or "recording.py (this tree)": load_impl(path) for path in (args.impl or [None])}
            rng = random.Random(7)
            results: dict[str, dict[int, list[float]]] = {name: {s: [] for s in SIZES} for name in impls}
            for _ in range(args.rounds):  # versions alternated, so load changes hit them alike
                for name, impl in impls.items():
                    for size in SIZES:
                        results[name][size].append(measure(impl, size, args.batches, rng)["cpu_ms_per_batch"])
            out: dict = {"db": connection.vendor, "loadavg": os.getloadavg(), "batches": args.batches,
                         "cpu_ms_per_batch (median per round)": {n: {str(s): v for s, v in r.items()}
                                                                 for n, r in results.items()}}
            if args.count_queries:
                connection.force_debug_cursor = True
                out["queries_per_batch"] = {n: {str(s): measure(impl, s, 20, rng)["queries_per_batch"] for s in SIZES}
                                            for n, impl in impls.items()}
                connection.force_debug_cursor = False
            prune = {}
            for name, impl in impls.items():  # each prunes 300 new traces beyond 1000 kept
                impl.prune_traces(keep=1000)
                for _ in range(15):
                    impl.record_now(make_batch(20, rng))
                c0 = time.process_time()
                impl.prune_traces(keep=1000)
                prune[name] = round((time.process_time() - c0) * 1000, 3)
            out["prune_traces_cpu_ms (300 of 1300 traces)"] = prune
            print(json.dumps(out, indent=1))
            connection.close()
    finally:
        if pg_db:
            pg_admin(f"DROP DATABASE IF EXISTS {pg_db} WITH (FORCE)")


if __name__ == "__main__":
    main()
