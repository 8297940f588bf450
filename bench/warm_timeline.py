"""Warm engine calls in-process, and where one goes. See bench/README.md.

    python bench/warm_timeline.py [calls] [--no-spawn]     p50/p95 of warm `engine.invoke` against direct spawns
    python bench/warm_timeline.py [calls] --timeline       the steps of each warm call, p50 per step (needs perf)
        --faults     the hook's page faults per step and by mapping of the zygote (--stacks: with call chains,
                     perf data kept in $TMPDIR/warm_timeline_faults.data)
        --syscalls   the median call's syscalls, hook and init

Runs `engine.invoke.invoke` of the bench's python hook (bench/run.py `write_plugins`: tests/fixtures/wasm/reflect.py)
with warm start, interleaved with direct spawns of the same hook as bench/run.py's "direct" phase does.

`--timeline` runs a copy of that hook that also writes `time.monotonic_ns()` on stderr when its `__main__` starts and
once its answer is flushed, marks the worker's steps (monkeypatched, in this process), and records the kernel's side
with `perf record -k mono` (CLOCK_MONOTONIC, as time.monotonic_ns): tracepoints of the hook's process (pid 2 of its
namespace), its init (pid 1: a fork that forks the hook, or the native init beside it) and keeper, and the zygote.
Each step's time is from the invoke's start.
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.run import REFLECT_PY, DirectSpawn, EngineDirect, own_cpu_ms, pct, write_plugins  # noqa: E402
from engine.process import hook_io, warmstart, zygote_client  # noqa: E402

PROBE_HOOK = """import time, os
os.write(2, b"T main %d\\n" % time.monotonic_ns())
""" + REFLECT_PY.read_text() + """
sys.stdout.flush()
os.write(2, b"T out %d\\n" % time.monotonic_ns())
"""

PERF_EVENTS = [
    ("sched:sched_process_fork", None),
    ("sched:sched_process_exit", None),
    ("syscalls:sys_exit_recvmsg", None),
    ("syscalls:sys_enter_exit_group", None),
    ("syscalls:sys_exit_wait4", None),
    ("syscalls:sys_enter_write", None),
    ("syscalls:sys_exit_epoll_wait", None),
    ("syscalls:sys_enter_sendto", None),
    ("syscalls:sys_enter_sendmsg", None),
    ("syscalls:sys_enter_read", "fd == 0"),
]
STACKS_DATA = Path(tempfile.gettempdir()) / "warm_timeline_faults.data"
SYSCALL_EVENTS = [("raw_syscalls:sys_enter", None), ("raw_syscalls:sys_exit", None)]


def syscall_names() -> dict[int, str]:
    names = {}
    try:
        text = Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h").read_text()
    except OSError:
        return names
    for m in re.finditer(r"#define __NR_(\w+) (\d+)", text):
        names[int(m.group(2))] = m.group(1)
    return names


class Marks:
    """Worker-side marks of the current call (monkeypatched into engine/process/zygote_client.py and hook_io.py)."""

    def __init__(self):
        self.cur: dict = {}
        self.stdout_fd = None

    def install(self):
        marks = self
        real_send_call = zygote_client.send_call

        def send_call(sock, length, fds):
            real_send_call(sock, length, fds)
            marks.cur["handover_sent"] = time.monotonic_ns()

        zygote_client.send_call = send_call
        real_init = zygote_client.WarmProcess.__init__

        def init(self, *args, **kwargs):
            marks.cur["pid_received"] = time.monotonic_ns()
            real_init(self, *args, **kwargs)
            marks.cur["keeper"] = self.pid
            marks.stdout_fd = self.stdout.fileno()

        zygote_client.WarmProcess.__init__ = init
        real_finish = zygote_client.WarmProcess._finish

        def finish(self, rc):
            marks.cur.setdefault("rc_received", time.monotonic_ns())
            real_finish(self, rc)

        zygote_client.WarmProcess._finish = finish

        class OsProxy:
            def __getattr__(self, name):
                return getattr(os, name)

            @staticmethod
            def read(fd, n):
                data = os.read(fd, n)
                if not data and fd == marks.stdout_fd:
                    marks.cur["stdout_eof"] = time.monotonic_ns()
                return data

            @staticmethod
            def write(fd, data):
                n = os.write(fd, data)
                marks.cur.setdefault("stdin_written", time.monotonic_ns())
                return n

        hook_io.os = OsProxy()


def parse_perf(path: Path) -> list[tuple[int, str, str, str]]:
    """(ns, pid, event, args) of every sample, in time order."""
    out = subprocess.run(["perf", "script", "-i", str(path), "--ns", "-F", "pid,tid,time,event,trace"],
                         capture_output=True, text=True, check=False).stdout
    rows = []
    pat = re.compile(r"^\s*(\d+)/(\d+)\s+(\d+)\.(\d+):\s+(\S+):\s*(.*)$")
    for line in out.splitlines():
        m = pat.match(line)
        if m:
            ns = int(m.group(3)) * 10**9 + int(m.group(4).ljust(9, "0")[:9])
            rows.append((ns, int(m.group(2)), m.group(5), m.group(6)))
    rows.sort()
    return rows


def timeline(engine: EngineDirect, spawn: DirectSpawn, calls: int, work: Path, spawn_too: bool) -> None:
    marks = Marks()
    marks.install()
    for _ in range(5):
        engine.once("probe_py", True)
    zygote = warmstart.zygote_pids()[0]
    data = work / "perf.data"
    cmd = ["perf", "record", "-q", "-k", "mono", "-a", "-o", str(data)]
    for event, flt in PERF_EVENTS + (SYSCALL_EVENTS if "--syscalls" in sys.argv else []):
        cmd += ["-e", event] + (["--filter", flt] if flt else [])
    if "--faults" in sys.argv:
        cmd += ["-e", "minor-faults", "-c", "1", "-d"] + (["-g"] if "--stacks" in sys.argv else [])
    perf = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    results = []
    for _ in range(calls):
        if spawn_too:
            spawn.once()
        marks.cur = {"invoke_start": time.monotonic_ns()}
        stderr_lines: list[str] = []
        engine.sink.line = lambda plugin, hook, line, trace_id, into=stderr_lines: into.append(line)
        engine.once("probe_py", True)
        marks.cur["invoke_end"] = time.monotonic_ns()
        for line in stderr_lines:
            if line.startswith("T "):
                _, name, ns = line.split()
                marks.cur["hook_" + name] = int(ns)
        results.append(marks.cur)
        time.sleep(0.002)
    time.sleep(0.3)
    perf.send_signal(signal.SIGINT)
    perf.wait()
    rows = parse_perf(data)
    maps = Path(f"/proc/{zygote}/maps").read_text() if "--faults" in sys.argv else ""
    if "--stacks" in sys.argv:  # kept for `perf script -i` (call chains of each fault) after this run
        shutil.copy(data, STACKS_DATA)
    forks = {}  # child -> parent
    by_pid = collections.defaultdict(list)
    for ns, pid, event, args in rows:
        if event == "sched:sched_process_fork":
            m = re.search(r" pid=(\d+) .*child_pid=(\d+)", args)
            if m:
                forks[int(m.group(2))] = int(m.group(1))
        by_pid[pid].append((ns, event, args))
    children = collections.defaultdict(list)
    for child, parent in forks.items():
        children[parent].append(child)

    def first(pid, event, after, before=None, match=None):
        for ns, ev, args in by_pid.get(pid, ()):
            if ev == event and ns >= after and (before is None or ns <= before) and (match is None or match in args):
                return ns
        return None

    def last(pid, event, after, before, match=None):
        found = None
        for ns, ev, args in by_pid.get(pid, ()):
            if ev == event and after <= ns <= before and (match is None or match in args):
                found = ns
        return found

    steps = collections.defaultdict(list)
    steps_n = collections.defaultdict(list)
    fault_windows = []
    for r in results:
        t0, end = r["invoke_start"], r["invoke_end"]
        keeper = r.get("keeper")
        init, hook = init_and_hook(children, keeper)
        ev = dict(r)
        if hook:
            ev["hook_got_call"] = last(hook, "syscalls:sys_exit_recvmsg", t0, end)
            ev["hook_read_stdin"] = first(hook, "syscalls:sys_enter_read", t0, end)
            ev["hook_exit_group"] = first(hook, "syscalls:sys_enter_exit_group", t0, end)
            ev["hook_exit_tp"] = first(hook, "sched:sched_process_exit", t0, end + 50_000_000)
        if init:
            ev["init_wait4_ret"] = first(init, "syscalls:sys_exit_wait4", ev.get("hook_exit_group") or t0)
            ev["init_report_write"] = first(init, "syscalls:sys_enter_write", ev.get("init_wait4_ret") or t0)
        ev["zygote_sendmsg_to_spare"] = first(zygote, "syscalls:sys_enter_sendmsg", r.get("handover_sent", t0))
        if ev.get("init_report_write"):
            ev["zygote_woke"] = first(zygote, "syscalls:sys_exit_epoll_wait", ev["init_report_write"])
            ev["zygote_answered"] = first(zygote, "syscalls:sys_enter_sendto", ev["init_report_write"])
        if hook and "--faults" in sys.argv:
            faults = [ns for ns, e, _ in by_pid.get(hook, ()) if e == "minor-faults"]
            a, b = ev.get("hook_got_call") or t0, r.get("hook_main") or end
            steps_n["faults: call -> hook main"].append(sum(1 for ns in faults if a <= ns < b))
            steps_n["faults: hook main -> exit"].append(
                sum(1 for ns in faults if b <= ns < (ev.get("hook_exit_group") or end)))
            steps_n["faults: before the call"].append(sum(1 for ns in faults if ns < a))
            fault_windows.append((hook, a, b))
            marks_ = sorted((v, k) for k, v in r.items() if k.startswith("hook_") and isinstance(v, int))
            for (t1, k1), (t2, _k2) in zip(marks_, marks_[1:], strict=False):
                steps_n[f"faults {k1} ->"].append(sum(1 for ns in faults if t1 <= ns < t2))
        if keeper:
            ev["keeper_exit_tp"] = first(keeper, "sched:sched_process_exit", t0, end + 50_000_000)
        for k, v in ev.items():
            if isinstance(v, int) and k not in ("keeper",) and v > 10**9:
                steps[k].append((v - t0) / 1e6)
    if fault_windows:
        show_fault_regions(data, fault_windows, maps)
    if "--syscalls" in sys.argv:
        show_syscalls(results, children, by_pid)
    order = sorted(steps, key=lambda k: pct(steps[k], 50))
    print(f"{len(results)} warm calls, load {os.getloadavg()[0]:.2f}; p50 ms from invoke start (n = calls seen)")
    for k, v in steps_n.items():
        print(f"  {k:34s} p50 {pct(v, 50)}  p25 {pct(v, 25)}  p75 {pct(v, 75)}")
    for k in order:
        print(f"  {k:26s} {pct(steps[k], 50):7.3f}   p25 {pct(steps[k], 25):7.3f}  p75 {pct(steps[k], 75):7.3f}"
              f"  n={len(steps[k])}")


def show_fault_regions(data: Path, windows, maps: str) -> None:
    """Where the hook's page faults between its call's arrival and its `__main__` fall (the zygote's mappings)."""
    regions = []
    for line in maps.splitlines():
        parts = line.split()
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        regions.append((lo, hi, parts[5] if len(parts) > 5 else "[anon]", parts[1]))
    out = subprocess.run(["perf", "script", "-i", str(data), "--ns", "-F", "pid,time,event,addr,sym"],
                         capture_output=True, text=True, check=False).stdout
    want = {pid: (a, b) for pid, a, b in windows}
    counts = collections.Counter()
    syms = collections.Counter()
    for line in out.splitlines():
        m = re.match(r"^\s*(\d+)\s+(\d+)\.(\d+):\s+minor-faults:\s+([0-9a-f]+)\s*(.*)$", line)
        if not m or int(m.group(1)) not in want:
            continue
        ns = int(m.group(2)) * 10**9 + int(m.group(3).ljust(9, "0")[:9])
        a, b = want[int(m.group(1))]
        if not (a <= ns < b):
            continue
        addr = int(m.group(4), 16)
        name = next((f"{r[2]} {r[3]}" for r in regions if r[0] <= addr < r[1]), "[new mapping]")
        counts[name] += 1
        syms[m.group(5).strip()[:60]] += 1
    n = len(windows)
    print("faults per call, call -> hook main, by mapping of the zygote:")
    for name, c in counts.most_common(12):
        print(f"  {c / n:7.1f}  {name}")
    print("... by faulting symbol:")
    for name, c in syms.most_common(15):
        print(f"  {c / n:7.1f}  {name}")


def init_and_hook(children: dict, keeper) -> tuple:
    """(init, hook) of a keeper: its first child, and init's (init a fork that forks the hook) or the keeper's second
    (the hook forked beside the native init: engine/process/sandbox_tree.py split_beside)."""
    kids = children.get(keeper) or []
    init = kids[0] if kids else None
    hook = (children.get(init) or [None])[0] if init else None
    if hook is None and len(kids) > 1:
        hook = kids[1]
    return init, hook


def show_syscalls(results, children, by_pid) -> None:
    """The hook's (and init's) syscalls from the call's arrival to the hook's exit, for the median call."""
    names = syscall_names()
    spans = []
    for r in results:
        init, hook = init_and_hook(children, r.get("keeper"))
        if hook:
            spans.append((r["invoke_end"] - r["invoke_start"], r, init, hook))
    spans.sort(key=lambda x: x[0])
    _, r, init, hook = spans[len(spans) // 2]
    t0 = r["invoke_start"]
    print(f"median call ({(r['invoke_end'] - t0) / 1e6:.2f} ms): hook {hook}, init {init}")
    for who, pid in (("hook", hook), ("init", init)):
        enter = None
        for ns, ev, args in by_pid.get(pid, ()):
            if not (t0 <= ns <= r["invoke_end"]):
                continue
            if ev == "raw_syscalls:sys_enter":
                m = re.search(r"NR (\d+)", args)
                enter = (ns, names.get(int(m.group(1)), m.group(1)) if m else "?")
            elif ev == "raw_syscalls:sys_exit" and enter:
                m = re.search(r"NR (\d+) = (-?\d+)", args)
                ret = m.group(2) if m else "?"
                print(f"  {who} {(enter[0] - t0) / 1e6:7.3f} +{(ns - enter[0]) / 1e3:7.1f}us {enter[1]} = {ret}")
                enter = None


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    calls = int(args[0]) if args else 200
    spawn_too = "--no-spawn" not in sys.argv
    root = Path(tempfile.mkdtemp(prefix="librefang-warmtl-"))
    try:
        home = root / "home"
        write_plugins(home, False)
        probe = home / "plugins" / "probe_py"
        shutil.copytree(home / "plugins" / "bench_py", probe)
        (probe / "plugin.toml").write_text((probe / "plugin.toml").read_text().replace("bench_py", "probe_py"))
        (probe / "hooks" / "ingest.py").write_text(PROBE_HOOK)
        spawn = DirectSpawn(home)
        engine = EngineDirect(home)
        for _ in range(10):
            spawn.once()
            engine.once("bench_py", True)
        if "--timeline" in sys.argv:
            timeline(engine, spawn, calls, root, spawn_too)
            return 0
        warm, direct = [], []
        cpu = 0.0
        for _ in range(calls):
            if spawn_too:
                direct.append(spawn.once())
            before = own_cpu_ms()
            warm.append(engine.once("bench_py", True))
            cpu += own_cpu_ms() - before
        line = f"load {os.getloadavg()[0]:.2f}  warm p50 {pct(warm, 50):.2f} p95 {pct(warm, 95):.2f} ms"
        if direct:
            line += f"  direct p50 {pct(direct, 50):.2f} ms  ratio {pct(warm, 50) / pct(direct, 50):.3f}"
        print(line + f"  warm CPU/call {cpu / calls:.2f} ms (all processes)", flush=True)
    finally:
        warmstart.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
