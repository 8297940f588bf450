"""CPU of one cold hook call's processes, sandboxed against spawned directly: `bench/sandbox_cpu.py [calls]`.

For a static C hook (nothing but the process tree and the sandbox) and the bench's python hook, it runs `calls`
sequential calls each way and prints per call: the CPU of the processes of the call (direct: this process's reaped
children; sandboxed: what the spawner reaped: spare, keeper, init, hook), the spawner's own, this process's own
(`engine.process.runner.PROCESS.run` or `subprocess.run`), and wall time. The sandboxed calls run below the native spare
(engine/process/native_spare.py) and below the python spare (LIBREFANG_NATIVE_SPARE=0). Needs a C compiler.

Wall time here is not the bench's figure: calls back to back leave the spawner no time to prepare the next spare
ahead (and joining a cgroup v1 hierarchy waits for an RCU grace period), which `make bench`'s interleaved rounds do.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.process import native_spare, warmstart  # noqa: E402
from engine.process.runner import PROCESS, HookCall  # noqa: E402
from engine.process.runtimes import find_launcher, resolve_tag  # noqa: E402

STATIC_HOOK = 'int main(void){char b[4096];while(read(0,b,sizeof b)>0);write(1,"{}\\n",3);return 0;}\n'
PY_HOOK = "import json, sys\nsys.stdin.read()\nprint(json.dumps({}))\n"


def _ms(usage) -> float:
    return (usage.ru_utime + usage.ru_stime) * 1000


def _proc_cpu(pid: int) -> tuple[float, float]:
    """(own, reaped children) CPU ms of `pid`."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = 1000 / os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) * tick, (int(fields[13]) + int(fields[14])) * tick


def direct(argv: list[str], cwd: Path, calls: int) -> str:
    children, own, started = _ms(resource.getrusage(resource.RUSAGE_CHILDREN)), _ms(
        resource.getrusage(resource.RUSAGE_SELF)), time.perf_counter()
    for _ in range(calls):
        subprocess.run(argv, input=b"{}", capture_output=True, cwd=cwd, env={"PATH": os.environ["PATH"]}, check=True)
    return (f"call {(_ms(resource.getrusage(resource.RUSAGE_CHILDREN)) - children) / calls:6.2f}  "
            f"spawner     -  own {(_ms(resource.getrusage(resource.RUSAGE_SELF)) - own) / calls:5.2f}  "
            f"wall {(time.perf_counter() - started) * 1000 / calls:6.2f}")


def sandboxed(call: HookCall, calls: int, native: bool) -> str:
    os.environ[native_spare.SWITCH] = "1" if native else "0"
    warmstart.shutdown()
    for _ in range(3):  # the spawner's first spare is a plain fork; later ones are prepared
        assert PROCESS.run(call).ok
    spawner = next(iter(warmstart._spawners.values())).pid
    before, own, started = _proc_cpu(spawner), _ms(resource.getrusage(resource.RUSAGE_SELF)), time.perf_counter()
    for _ in range(calls):
        result = PROCESS.run(call)
        assert result.ok, result.failure
    after = _proc_cpu(spawner)
    return (f"call {(after[1] - before[1]) / calls:6.2f}  spawner {(after[0] - before[0]) / calls:5.2f}  "
            f"own {(_ms(resource.getrusage(resource.RUSAGE_SELF)) - own) / calls:5.2f}  "
            f"wall {(time.perf_counter() - started) * 1000 / calls:6.2f}")


def main() -> int:
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 150
    os.environ["LIBREFANG_WARM_START"] = "0"
    root = Path(tempfile.mkdtemp(prefix="lf-sandbox-cpu-"))
    home, pdir = root / "home", root / "home" / "plugins" / "p"
    (pdir / "hooks").mkdir(parents=True)
    (root / "hook.c").write_text("#include <unistd.h>\n" + STATIC_HOOK)
    subprocess.run([os.environ.get("CC", "cc"), "-O2", "-static", "-o", str(pdir / "hooks" / "tiny"),
                    str(root / "hook.c")], check=True)
    (pdir / "hooks" / "h.py").write_text(PY_HOOK)
    print(f"ms per call, {calls} calls each, load average {os.getloadavg()[0]:.1f}")
    for label, runtime, script, argv in (("static C hook", "native", "hooks/tiny", ["hooks/tiny"]),
                                         ("python hook", "python", "hooks/h.py", [find_launcher("python"),
                                                                                   "hooks/h.py"])):
        call = HookCall(plugin_dir=pdir, script=script, runtime=resolve_tag(runtime), request={}, timeout_secs=20,
                        data_dir=home / "plugin_data" / "p", home_dir=home)
        print(f"{label:14} direct              {direct(argv, pdir, calls)}")
        print(f"{label:14} native spare        {sandboxed(call, calls, True)}")
        print(f"{label:14} python spare        {sandboxed(call, calls, False)}")
    warmstart.shutdown()
    return 0


def _own_mounts() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests import mount_namespace

    mount_namespace.enter()


if __name__ == "__main__":
    _own_mounts()  # the data disks its homes get stay in its own mount namespace (tests/mount_namespace.py)
    sys.exit(main())
