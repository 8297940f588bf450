"""The cost of a bundle cache miss (first call of a plugin version on a host) against a hit and a hook spawn.

A miss: unpack the gzip tarball into $LIBREFANG_HOME/bundles/<hash>/<plugin>/, hash every file to verify it, make it
read-only (engine/plugins/bundles.py, materialise); fetching the blob from the database comes on top (one row by primary
key). A hit: the `stat` that finds the directory. The spawn: `python3 -c pass`, the floor of any Python hook call.

    .venv/bin/python bench/bundle_cache.py [rounds]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.plugins import bundles as B  # noqa: E402
from engine.plugins.scaffold import plan  # noqa: E402


def ms(samples: list[float]) -> str:
    return f"median {statistics.median(samples) * 1000:.3f} ms, p90 {sorted(samples)[int(len(samples) * 0.9)] * 1000:.3f} ms"


def main(rounds: int = 30) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        pdir = root / "plugins" / "bench-plugin"
        for rel, data in plan("bench-plugin", "bench", "python", ["ingest", "after_turn"]).files.items():
            (pdir / rel).parent.mkdir(parents=True, exist_ok=True)
            (pdir / rel).write_bytes(data)
        digest, blob = B.pack(pdir)
        miss, hit, spawn = [], [], []
        for i in range(rounds):
            cache = root / f"cache{i}"
            t = time.perf_counter()
            B.materialise(cache, digest, "bench-plugin", blob)
            miss.append(time.perf_counter() - t)
            t = time.perf_counter()
            B.cached_dir(cache, digest, "bench-plugin").is_dir()
            hit.append(time.perf_counter() - t)
            t = time.perf_counter()
            subprocess.run([sys.executable, "-c", "pass"], check=True)
            spawn.append(time.perf_counter() - t)
        files = len(list(p for p in pdir.rglob("*") if p.is_file()))
        print(f"scaffolded python plugin: {files} files, bundle {len(blob)} bytes")
        print(f"cache miss (unpack + verify + read-only): {ms(miss)}")
        print(f"cache hit (stat):                         {ms(hit)}")
        print(f"python spawn (python -c pass):            {ms(spawn)}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 30)
