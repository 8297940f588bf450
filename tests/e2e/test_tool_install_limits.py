"""POST /api/tools/install against the real service: a gzip bomb is refused with 413 by the worker that unpacks
it, and neither daphne nor the worker grows anywhere near what the archive expands to."""

from __future__ import annotations

from tests.fixtures.packages import MB, gzip_bomb
from tests.fixtures.wasm.wat import fixture_wasm, tool_manifest


def _reset_peak(pid: int) -> None:
    with open(f"/proc/{pid}/clear_refs", "w") as fh:  # "5" resets the peak RSS (VmHWM) to the current RSS
        fh.write("5")


def _peak_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        return int(next(line for line in fh if line.startswith("VmHWM:")).split()[1]) * 1024


def test_it_refuses_a_gzip_bomb_on_the_worker_and_no_process_balloons(live):
    bomb = gzip_bomb({"plugin.wasm": 1024 * MB})  # 1 GiB of zeros in about 1 MB, as in the report
    assert len(bomb) < 2 * MB
    procs = {"daphne": live.web.pid, "worker": live.workers[0].pid}
    for pid in procs.values():
        _reset_peak(pid)
    status, body = live.request("POST", "/api/tools/install", raw=bomb, headers={"Content-Type": "application/x-tar"})
    assert status == 413, body
    assert body["error"]["code"] == "payload_too_large"
    assert "declares 1073741824 bytes, more than the module size policy" in body["error"]["message"]
    for name, pid in procs.items():
        assert _peak_bytes(pid) < 400 * MB, f"{name} peaked at {_peak_bytes(pid) / MB:.0f} MB"
    tools = live.home / "tools"
    assert not (tools / "bomb").exists() and not any((tools / ".incoming").iterdir())


def test_it_installs_a_real_package_through_the_worker_and_runs_it(live):
    from engine.wasm import tools as T

    echo = fixture_wasm("echo")
    package = T.package(tool_manifest("e2e-echo", echo), echo)
    status, body = live.request("POST", "/api/tools/install", raw=package, headers={"Content-Type": "application/x-tar"})
    assert status == 201, body
    assert body["id"] == "e2e-echo" and body["module_name"] == "echo_plugin" and body["hash_ok"] is True
    status, run = live.request("POST", "/api/tools/e2e-echo/execute", {"input": '{"task": "hi"}'})
    assert status == 200 and run["ok"] and run["output"] == "echo:ok", run
    assert live.request("DELETE", "/api/tools/e2e-echo")[0] == 200
