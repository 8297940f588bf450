"""What a plugin's data disk costs (engine/process/data_disks.py): `bench/data_disks.py [rounds] [--mb N]`, as root.

- make: the first `ensure` of a plugin whose data directory is empty (sparse image, mkfs.ext4, loop mount);
- make + move: the same for a directory that already holds 1,000 files of 16 kB (moved into the new filesystem);
- remount: `ensure` of an existing image after `release_all` (a restarted service);
- check: what every later call pays (`ensure` finding it ready, and `epoch` for the sandbox spec), in µs;
- host disk: what a fresh image takes on the host's filesystem (it is sparse).

Medians of `rounds` (default 20), each in a fresh directory; runs in a mount namespace of its own.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from engine.process import data_disks  # noqa: E402
from tests import mount_namespace  # noqa: E402


def _ensure_ms(data_dir: Path, size_mb: int) -> float:
    started = time.perf_counter()
    data_disks.ensure(data_dir, size_mb)
    return (time.perf_counter() - started) * 1000


def main() -> int:
    args = sys.argv[1:]
    rounds = int(args[0]) if args and not args[0].startswith("--") else 20
    size_mb = int(args[args.index("--mb") + 1]) if "--mb" in args else 1024
    if not mount_namespace.enter() or data_disks.unavailable():
        print(f"needs root with loop devices: {data_disks.unavailable() or 'not root'}")
        return 1
    made, moved, remounted, checks, blocks = [], [], [], [], []
    for _ in range(rounds):
        root = Path(tempfile.mkdtemp(prefix="lf-disks-bench-"))
        try:
            empty, full = root / "plugin_data" / "empty", root / "plugin_data" / "full"
            empty.mkdir(parents=True)
            full.mkdir()
            for i in range(1000):
                (full / f"f{i}").write_bytes(b"x" * 16384)
            made.append(_ensure_ms(empty, size_mb))
            assert data_disks.note(empty) is None and data_disks.usage(empty) is not None
            moved.append(_ensure_ms(full, size_mb))
            assert data_disks.note(full) is None and len(os.listdir(full)) == 1000
            blocks.append((root / "plugin_data" / ".disks" / "empty.img").stat().st_blocks * 512)
            n = 10_000
            started = time.perf_counter()
            for _ in range(n):
                data_disks.ensure(empty, size_mb)
                data_disks.epoch(empty)
            checks.append((time.perf_counter() - started) * 1e6 / n)
            data_disks.release_all(root)
            data_disks.forget()
            remounted.append(_ensure_ms(empty, size_mb))
        finally:
            data_disks.release_all(root)
            shutil.rmtree(root, ignore_errors=True)
    med = statistics.median
    print(f"{rounds} rounds, images of {size_mb} MB, load average {os.getloadavg()[0]:.1f}; medians")
    print(f"make (empty directory)        {med(made):7.1f} ms")
    print(f"make + move 1,000 files, 16 MB {med(moved):6.1f} ms")
    print(f"remount (after a release)     {med(remounted):7.1f} ms")
    print(f"check per call (ready, epoch) {med(checks):7.2f} us")
    print(f"host disk of a fresh image    {med(blocks) / 1024:7.0f} kB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
