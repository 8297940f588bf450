"""Which `Runtime` (engine/process/hook_call.py) runs a hook call: engine/invoke.py `runtime_for` (WASM in the worker,
PROCESS for every other hook), and how the process runtime starts one (engine/process/runner.py): forked from its
zygote when it is a python hook that can be, else exec'd by the spawner, which also takes a python hook no zygote
can fork right now."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from engine import protocol as P
from engine.invoke import runtime_for
from engine.process import warmstart
from engine.process.runner import PROCESS, HookCall
from engine.process.runtimes import resolve_tag
from engine.wasm import WASM
from tests.engine.helpers import write_hook

ECHO = ("import json, sys\nreq = json.loads(sys.stdin.read())\n"
        "print(json.dumps({'got': req['n'], 'warm': b'warmstart_zygote' in open('/proc/self/cmdline', 'rb').read()}))\n")
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="warm start is linux only")


pytestmark = pytest.mark.usefixtures("fresh_zygotes")


def _call(tmp_path: Path, runtime: str = "python", script: str = "hooks/hook.py", source: str | None = ECHO,
          **kw) -> HookCall:
    pdir = tmp_path / "p"
    if source is not None:
        write_hook(pdir, source, script)
    return HookCall(plugin_dir=pdir, script=script, runtime=resolve_tag(runtime), request={"n": 7}, timeout_secs=20,
                    data_dir=tmp_path / "data", **kw)


@pytest.fixture
def starts(monkeypatch):
    """The helpers the process runtime asked to start each hook: {"forks": [argv], "execs": [argv]} (both real)."""
    seen: dict[str, list] = {"forks": [], "execs": []}
    real_spawn, real_exec = warmstart.spawn, warmstart.spawn_exec
    monkeypatch.setattr(warmstart, "spawn", lambda argv, *rest: seen["forks"].append(argv) or real_spawn(argv, *rest))
    monkeypatch.setattr(warmstart, "spawn_exec",
                        lambda argv, *rest: seen["execs"].append(argv) or real_exec(argv, *rest))
    return seen


def test_a_wasm_hook_runs_in_the_worker(tmp_path):
    assert runtime_for(_call(tmp_path, "wasm", "hooks/h.wasm", source=None)) is WASM


def test_a_custom_launcher_is_a_process_even_for_a_wasm_module(tmp_path):
    call = _call(tmp_path, "/usr/local/bin/wasmtime", "hooks/h.wasm", source=None)
    assert runtime_for(call) is PROCESS


@linux_only
def test_a_python_hook_is_forked_from_its_zygote_and_never_asks_the_spawner(tmp_path, starts):
    call = _call(tmp_path)
    assert runtime_for(call) is PROCESS
    r = PROCESS.run(call)
    assert r.ok and r.reply == {"got": 7, "warm": True}, r.failure
    assert len(starts["forks"]) == 1 and starts["execs"] == [] and warmstart.zygote_pids()


@pytest.mark.parametrize("why", ["plugin", "service"])
def test_a_python_hook_without_warm_start_is_exec_d_by_the_spawner(tmp_path, monkeypatch, starts, why):
    if why == "service":
        monkeypatch.setenv("LIBREFANG_WARM_START", "0")
    r = PROCESS.run(_call(tmp_path, warm_start=why != "plugin"))
    assert r.ok and r.reply == {"got": 7, "warm": False}, r.failure
    assert starts["forks"] == [] and len(starts["execs"]) == 1


def test_other_hooks_are_exec_d_by_the_spawner(tmp_path, starts):
    call = _call(tmp_path, "bash", "hooks/hook.sh", "read -r _\necho '{\"got\": 7}'\n")
    assert runtime_for(call) is PROCESS
    r = PROCESS.run(call)
    assert r.ok and r.reply == {"got": 7}, r.failure
    assert starts["forks"] == [] and len(starts["execs"]) == 1


def test_a_python_hook_without_its_launcher_says_so(tmp_path, monkeypatch, starts):
    monkeypatch.setattr("engine.process.runtimes.find_launcher", lambda tag: None)
    r = PROCESS.run(_call(tmp_path))
    assert r.failure.kind == P.LAUNCHER_NOT_FOUND and "python3" in r.failure.message
    assert starts == {"forks": [], "execs": []}


def test_a_wasm_call_is_never_run_as_a_command(tmp_path):
    call = _call(tmp_path, "wasm", "hooks/h.wasm", source=None)
    (call.plugin_dir / "hooks").mkdir(parents=True)
    (call.plugin_dir / "hooks" / "h.wasm").write_bytes(b"\0asm\1\0\0\0")
    r = PROCESS.run(call)
    assert r.failure.kind == P.LAUNCHER_NOT_FOUND and "in-process" in r.failure.message


@linux_only
def test_a_python_hook_no_zygote_can_fork_now_is_exec_d_by_the_spawner(tmp_path, monkeypatch):
    forks, execs = [], []
    real_exec = warmstart.spawn_exec
    monkeypatch.setattr(warmstart, "spawn", lambda argv, spec, *rest: forks.append(argv))  # None: no zygote right now
    monkeypatch.setattr(warmstart, "spawn_exec", lambda argv, spec, *rest: execs.append(argv) or real_exec(argv, spec, *rest))
    r = PROCESS.run(_call(tmp_path))
    assert r.ok and r.reply == {"got": 7, "warm": False}, r.failure
    assert len(forks) == 1 and len(execs) == 1 and execs[0][1:] == forks[0][1:]
    assert not warmstart.zygote_pids()
