"""Our own CPU per engine call, warm and cold, and the call's p50: `bench/engine_cpu.py [calls] [--against TREE]
[--rounds N]`.

A call is the process runtime's run (`engine.invoke.runtime_for(call).run(call)`, engine/process/runner.py) of the
bench's python hook (`tests/fixtures/wasm/reflect.py`'s shape, with
`allow_network = false`), as the worker makes it. "Our own CPU" is everything the call costs but the hook's own
process: this process (the worker's side), the zygote or spawner (its own CPU and what it reaped: spare, keeper,
init and the hook) minus the hook process's own CPU, which the hook reports itself (RUSAGE_SELF at its end: its
interpreter's start-up and script, and what the sandbox did in that process before its exec: so `total_cpu_ms`,
the same with the hook's process in, is printed too; the hook being the same on both sides, its difference between
two trees is the sandbox's). The kernel's deferred namespace teardown (kworkers) is in neither.

With `--against TREE` (another checkout, e.g. `git worktree add /tmp/base 71929df` with its native spare built),
rounds alternate between this tree and that one, each in a fresh process running this script against that tree's
`engine` package, so both see the same machine and the same measuring code; the medians of the rounds are printed
side by side with their ratio. This is the figure the containment's cost limit is stated in (docs/security.md: at
most +10 %).

CPU is read from a cpuacct cgroup of the round's own (nanoseconds, every process the round starts counted alive or
reaped) where this process may make one (root, cgroup v1's cpuacct); elsewhere from /proc/<pid>/stat, whose
clock ticks (10 ms) make a round of 30 calls good to about a third of a millisecond per call.

With `--not-root` (run as root), rounds run this tree as an ordinary user instead, alternately with a subordinate
range ("this": hooks as identities of their own, docs/security.md "A service that is not root") and without one
("other": hooks as the service's own user). The user and its ranges exist only in a mount namespace of the round's
own (/etc/passwd, group, subuid and subgid bound over there), as in tests/engine/test_sandbox_subids.py.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
HOOK = ("import json, resource, sys\nreq = sys.stdin.read()\nu = resource.getrusage(resource.RUSAGE_SELF)\n"
        "print(json.dumps({'cpu_ms': (u.ru_utime + u.ru_stime) * 1000, 'n': len(req)}))\n")


def _proc_cpu(pid: int) -> float:
    """Own + reaped children CPU ms of `pid`."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = 1000 / os.sysconf("SC_CLK_TCK")
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) * tick


def _self_ms() -> float:
    u = resource.getrusage(resource.RUSAGE_SELF)
    return (u.ru_utime + u.ru_stime) * 1000


class CpuMeter:
    """CPU ms of this process and everything it starts: a cpuacct cgroup of its own when one can be made, else this
    process plus the helpers' own and reaped CPU (`/proc/<pid>/stat`, clock ticks)."""

    def __init__(self) -> None:
        self.group = self.home = None
        root = next((line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
                     if line.split()[2] == "cgroup" and "cpuacct" in line.split()[3].split(",")), None)
        if root is None:
            return
        mine = next((line.split(":", 2)[2] for line in Path("/proc/self/cgroup").read_text().splitlines()
                     if "cpuacct" in line.split(":", 2)[1].split(",")), "/")
        group = Path(root) / f"librefang-bench-{os.getpid()}"
        try:
            group.mkdir()
            (group / "cgroup.procs").write_text(str(os.getpid()))
        except OSError:
            if group.exists():
                group.rmdir()
            return
        self.group, self.home = group, Path(root) / mine.lstrip("/")

    def read(self, helpers: list) -> float:
        if self.group is not None:
            return int((self.group / "cpuacct.usage").read_text()) / 1e6
        return sum(map(_proc_cpu, helpers)) + _self_ms()

    def close(self) -> None:
        """Back to where this process was; the cgroup removed once the helpers' processes are gone."""
        if self.group is None:
            return
        (self.home / "cgroup.procs").write_text(str(os.getpid()))
        for _ in range(200):
            try:
                self.group.rmdir()
                return
            except OSError:
                time.sleep(0.01)
        print(f"could not remove {self.group}", file=sys.stderr)


def one_round(calls: int, tree: Path = HERE) -> dict:
    """In `tree`: `calls` warm then `calls` cold calls; {mode: {"p50_ms", "own_cpu_ms", "total_cpu_ms"}}."""
    sys.path.insert(0, str(tree))
    from engine.invoke import runtime_for  # (in every tree this bench compares)
    from engine.process import warmstart
    from engine.process.runner import HookCall
    from engine.process.runtimes import resolve_tag

    meter = CpuMeter()
    root = Path(tempfile.mkdtemp(prefix="lf-engine-cpu-"))
    home, pdir = root / "home", root / "home" / "plugins" / "bench_py"
    (pdir / "hooks").mkdir(parents=True)
    (pdir / "hooks" / "ingest.py").write_text(HOOK)
    out = {}
    try:
        for mode in ("warm", "cold"):
            os.environ["LIBREFANG_WARM_START"] = "1" if mode == "warm" else "0"
            warmstart.shutdown()
            call = HookCall(plugin_dir=pdir, script="hooks/ingest.py", runtime=resolve_tag("python"),
                            request={"agent_id": "a", "message": "hello " * 20}, timeout_secs=20,
                            data_dir=home / "plugin_data" / "bench_py", home_dir=home, allow_network=False)
            runtime = runtime_for(call)
            for _ in range(5):  # helpers started, spares prepared
                assert runtime.run(call).ok
                time.sleep(0.02)
            helpers = warmstart.helper_pids()
            before, walls, hook_cpu = meter.read(helpers), [], 0.0
            for _ in range(calls):
                started = time.perf_counter()
                result = runtime.run(call)
                walls.append((time.perf_counter() - started) * 1000)
                assert result.ok, (result.failure, result.stderr)
                hook_cpu += result.reply["cpu_ms"]
                time.sleep(0.02)  # the helper prepares its next spare after the answer, as between agents' calls
            time.sleep(0.3)
            total = meter.read(helpers) - before
            out[mode] = {"p50_ms": round(statistics.median(walls), 3),
                         "own_cpu_ms": round((total - hook_cpu) / calls, 3), "total_cpu_ms": round(total / calls, 3)}
        warmstart.shutdown()
        from engine.process import sandbox

        out["sandbox"] = sandbox.mode()
        if out["sandbox"] == "subids":
            out["one_off"] = _one_off_costs(sandbox)
    finally:
        meter.close()
        try:
            from engine.process import data_disks

            data_disks.release_all(root)  # the bench plugin's data disk, with its home
        except ImportError:  # (a tree from before the data disks)
            pass
        shutil.rmtree(root, ignore_errors=True)
    return out


def _one_off_costs(sandbox) -> dict:
    """A service that is not root: what making its user namespace costs (newuidmap + newgidmap, once per process that
    starts hooks: what each call would pay if every hook's namespace were mapped by them), and what running a function
    as its root costs (a fork of this process: a plugin's first call, install-deps, wipes); medians of 9, wall and
    CPU (with the children's), ms."""
    from engine.process import sandbox_userns

    def timed(fn) -> tuple[float, float]:
        started, cpu = time.perf_counter(), _self_ms() + _children_ms()
        fn()
        return (time.perf_counter() - started) * 1000, _self_ms() + _children_ms() - cpu

    ids = (sandbox.mapped_ids(), os.getuid(), os.getgid())
    made = [timed(lambda: os.close(sandbox_userns._make(*ids))) for _ in range(9)]
    owned = [timed(lambda: sandbox.as_owner(os.getpid)) for _ in range(9)]
    return {name: {"wall_ms": round(statistics.median(w for w, _ in runs), 3),
                   "cpu_ms": round(statistics.median(c for _, c in runs), 3)}
            for name, runs in (("user_namespace", made), ("as_owner", owned))}


def _children_ms() -> float:
    u = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (u.ru_utime + u.ru_stime) * 1000


NOT_ROOT_UID, NOT_ROOT_NAME = 1_700_000_777, "lf-bench"


def _not_root_round(script: Path, calls: int, ranges: bool) -> subprocess.CompletedProcess:
    """`script --round calls` as NOT_ROOT_NAME, in a mount namespace whose /etc names it and, with `ranges`, gives it
    65,536 subordinate uids and gids."""
    python = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
    site = HERE / ".venv" / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    user = f"{NOT_ROOT_NAME}:x:{NOT_ROOT_UID}:{NOT_ROOT_UID}::/:/bin/false\n"
    files = {"passwd": Path("/etc/passwd").read_text() + user,
             "group": Path("/etc/group").read_text() + f"{NOT_ROOT_NAME}:x:{NOT_ROOT_UID}:\n",
             "subuid": f"{NOT_ROOT_NAME}:1730000000:65536\n" if ranges else "",
             "subgid": f"{NOT_ROOT_NAME}:1730000000:65536\n" if ranges else ""}
    etc = Path(tempfile.mkdtemp(prefix="lf-bench-etc-"))
    tmp = Path(tempfile.mkdtemp(prefix="lf-bench-tmp-"))  # the round's, removed here (its hooks' files are not its)
    try:
        os.chown(tmp, NOT_ROOT_UID, NOT_ROOT_UID)
        os.chmod(etc, 0o755)
        for name, text in files.items():
            (etc / name).write_text(text)
            os.chmod(etc / name, 0o644)
        binds = " && ".join(f"mount --bind {etc / name} /etc/{name}" for name in files)
        inner = f'{binds} && exec setpriv --reuid={NOT_ROOT_UID} --regid={NOT_ROOT_UID} --clear-groups "$@"'
        env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": str(tmp), "PYTHONPATH": f"{HERE}:{site}"}
        return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", inner, "sh", python,
                               str(script), "--round", str(calls)], capture_output=True, text=True, check=True,
                              cwd="/tmp", env=env)
    finally:
        shutil.rmtree(etc, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    args = sys.argv[1:]
    if args and args[0] == "--round":
        tree = Path(args[args.index("--tree") + 1]).resolve() if "--tree" in args else HERE
        print(json.dumps(one_round(int(args[1]), tree)))
        return 0
    calls = int(args[0]) if args and not args[0].startswith("--") else 100
    not_root = "--not-root" in args
    against = HERE if not_root else Path(args[args.index("--against") + 1]) if "--against" in args else None
    rounds = int(args[args.index("--rounds") + 1]) if "--rounds" in args else 3
    trees = [("this", HERE)] + ([("other", against)] if against else [])
    results: dict = {name: [] for name, _ in trees}
    for _ in range(rounds):
        for name, tree in trees:
            if not_root:
                done = _not_root_round(Path(__file__), calls, ranges=name == "this")
            else:
                done = subprocess.run([sys.executable, __file__, "--round", str(calls), "--tree", str(tree)],
                                      capture_output=True, text=True, check=True, cwd=tree)
            results[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
    if not_root:
        print("as an ordinary user: this = with a subordinate range, other = without one; sandbox modes:",
              {name: sorted({r.get("sandbox") for r in runs}) for name, runs in results.items()})
    print(f"{calls} calls per round, {rounds} rounds, load average {os.getloadavg()[0]:.1f}; medians of the rounds")
    for mode in ("warm", "cold"):
        for key in ("p50_ms", "own_cpu_ms", "total_cpu_ms"):
            med = {name: statistics.median(r[mode][key] for r in runs) for name, runs in results.items()}
            line = f"{mode:5} {key:12} this {med['this']:7.3f}"
            if against:
                line += f"   other {med['other']:7.3f}   this/other {med['this'] / med['other']:.3f}"
            print(line)
    one_off = [r["one_off"] for runs in results.values() for r in runs if "one_off" in r]
    for name in ("user_namespace", "as_owner") if one_off else ():
        print(f"one-off {name:14} wall {statistics.median(o[name]['wall_ms'] for o in one_off):7.3f} ms   "
              f"cpu {statistics.median(o[name]['cpu_ms'] for o in one_off):7.3f} ms")
    print(json.dumps(results))
    return 0


def _own_mounts() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests import mount_namespace

    mount_namespace.enter()


if __name__ == "__main__":
    _own_mounts()  # the data disks its homes get stay in its own mount namespace (tests/mount_namespace.py)
    sys.exit(main())
