"""Which `Runtime` (engine/process/hook_call.py) runs a hook call: engine/invoke.py `runtime_for`, and the warm
start's fall back to a cold subprocess when no zygote can fork the hook."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from engine import protocol as P
from engine.invoke import execute, runtime_for
from engine.process import warmstart
from engine.process.runner import SUBPROCESS, WARM_START, HookCall, run_hook
from engine.process.runtimes import resolve_tag
from engine.wasm import WASM
from tests.engine.helpers import write_hook

ECHO = "import json, sys\nreq = json.loads(sys.stdin.read())\nprint(json.dumps({'got': req['n']}))\n"
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="warm start is linux only")


pytestmark = pytest.mark.usefixtures("fresh_zygotes")


def _call(tmp_path: Path, runtime: str = "python", script: str = "hooks/hook.py", source: str | None = ECHO,
          **kw) -> HookCall:
    pdir = tmp_path / "p"
    if source is not None:
        write_hook(pdir, source, script)
    return HookCall(plugin_dir=pdir, script=script, runtime=resolve_tag(runtime), request={"n": 7}, timeout_secs=20,
                    data_dir=tmp_path / "data", **kw)


def test_a_wasm_hook_runs_in_the_worker(tmp_path):
    assert runtime_for(_call(tmp_path, "wasm", "hooks/h.wasm", source=None)) is WASM


def test_a_custom_launcher_is_a_subprocess_even_for_a_wasm_module(tmp_path):
    call = _call(tmp_path, "/usr/local/bin/wasmtime", "hooks/h.wasm", source=None)
    assert runtime_for(call) is SUBPROCESS


@linux_only
def test_a_python_hook_is_warm_started(tmp_path):
    assert runtime_for(_call(tmp_path)) is WARM_START


@pytest.mark.parametrize("why", ["plugin", "service"])
def test_a_python_hook_without_warm_start_is_a_subprocess(tmp_path, monkeypatch, why):
    if why == "service":
        monkeypatch.setenv("LIBREFANG_WARM_START", "0")
    call = _call(tmp_path, warm_start=why != "plugin")
    assert runtime_for(call) is SUBPROCESS


def test_other_hooks_are_subprocesses(tmp_path):
    call = _call(tmp_path, "bash", "hooks/hook.sh", "read -r _\necho '{\"got\": 7}'\n")
    assert runtime_for(call) is SUBPROCESS
    r = execute(call)
    assert r.ok and r.reply == {"got": 7}, r.failure


def test_a_python_hook_without_its_launcher_is_a_subprocess_that_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr("engine.process.runtimes.find_launcher", lambda tag: None)
    call = _call(tmp_path)
    assert runtime_for(call) is SUBPROCESS
    r = execute(call)
    assert r.failure.kind == P.LAUNCHER_NOT_FOUND and "python3" in r.failure.message


def test_a_wasm_call_is_never_run_as_a_command(tmp_path):
    call = _call(tmp_path, "wasm", "hooks/h.wasm", source=None)
    (call.plugin_dir / "hooks").mkdir(parents=True)
    (call.plugin_dir / "hooks" / "h.wasm").write_bytes(b"\0asm\1\0\0\0")
    r = run_hook(call)
    assert r.failure.kind == P.LAUNCHER_NOT_FOUND and "in-process" in r.failure.message


@linux_only
def test_the_warm_start_forks_from_the_zygote_and_never_asks_the_spawner(tmp_path, monkeypatch):
    execs = []
    real_exec = warmstart.spawn_exec
    monkeypatch.setattr(warmstart, "spawn_exec", lambda argv, spec, *rest: execs.append(argv) or real_exec(argv, spec, *rest))
    r = WARM_START.run(_call(tmp_path))
    assert r.ok and r.reply == {"got": 7}, r.failure
    assert execs == [] and warmstart.zygote_pids()


@linux_only
def test_the_warm_start_falls_back_to_a_subprocess_when_no_zygote_can_fork(tmp_path, monkeypatch):
    forks, execs = [], []
    real_exec = warmstart.spawn_exec
    monkeypatch.setattr(warmstart, "spawn", lambda argv, spec, *rest: forks.append(argv))  # None: no zygote right now
    monkeypatch.setattr(warmstart, "spawn_exec", lambda argv, spec, *rest: execs.append(argv) or real_exec(argv, spec, *rest))
    r = WARM_START.run(_call(tmp_path))
    assert r.ok and r.reply == {"got": 7}, r.failure
    assert len(forks) == 1 and len(execs) == 1 and execs[0][1:] == forks[0][1:]
    assert not warmstart.zygote_pids()
