"""clients/librefang-bridge run the way LibreFang runs a plugin's hooks: the manifest's script by its absolute
path with the system python, in the daemon's working directory (LibreFang sets none), a scrubbed environment plus the manifest's `[env]` (whole-value `${VAR}` expanded
from the daemon's environment), one JSON line on stdin, the last JSON line of stdout as the answer, exit 0, within
`hook_timeout_secs` (twice that for bootstrap). Against a live service it answers the service's plugin answer;
with the service down, LibreFang's default."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import tomllib
from pathlib import Path

import pytest

from tests.e2e.live import free_port, running_service
from tests.own_redis import service_with_own_redis
from tests.plugin_factory import PY_ECHO_INGEST, make_plugin, write_config
from tests.waiting import wait_until

BRIDGE = Path(__file__).resolve().parents[2] / "clients" / "librefang-bridge"
MANIFEST = tomllib.loads((BRIDGE / "plugin.toml").read_text())


def run_hook(request: dict, daemon_env: dict[str, str]) -> tuple[dict, subprocess.CompletedProcess]:
    """One hook call as LibreFang makes it; the answer and the process."""
    hooks = MANIFEST["hooks"]
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), "LIBREFANG_RUNTIME": "python"}
    for name, value in MANIFEST.get("env", {}).items():
        whole = value.startswith("${") and value.endswith("}")
        env[name] = daemon_env.get(value[2:-1], "") if whole else value
    timeout = hooks["hook_timeout_secs"] * (2 if request["type"] == "bootstrap" else 1)
    done = subprocess.run([shutil.which("python3"), str(BRIDGE / hooks[request["type"]])], env=env, cwd="/",
                          input=json.dumps(request) + "\n", capture_output=True, text=True, timeout=timeout)
    lines = [line for line in done.stdout.splitlines() if line.strip().startswith("{")]
    return (json.loads(lines[-1]) if lines else {}), done


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    with running_service(tmp_path_factory.mktemp("bridge")) as live:
        yield live


@pytest.fixture
def daemon(service):
    return {"LIBREFANG_BRIDGE_URL": service.url, "LIBREFANG_BRIDGE_TOKEN": service.token}


def test_it_wires_every_hook_to_the_bridge_with_network_allowed():
    hooks = MANIFEST["hooks"]
    assert MANIFEST["name"] == BRIDGE.name and hooks["runtime"] == "python" and hooks["allow_network"] is True
    for hook in ("ingest", "after_turn", "bootstrap", "assemble", "compact", "prepare_subagent", "merge_subagent",
                 "transform_tool_result"):
        assert hooks[hook] == "hooks/bridge.py"


def test_it_stores_a_turn_and_recalls_it_through_the_service(service, daemon):
    turn = {"type": "after_turn", "agent_id": "bridged", "messages": [
        {"role": "user", "content": "My cat is called Miso", "pinned": False},
        {"role": "assistant", "content": "Nice name!", "pinned": False}]}
    reply, done = run_hook(turn, daemon)
    assert (reply, done.returncode) == ({"type": "ok"}, 0), done.stderr

    def ask() -> dict:
        reply, done = run_hook({"type": "ingest", "agent_id": "bridged", "message": "what is my cat called?",
                                "peer_id": None}, daemon)
        assert done.returncode == 0 and reply["type"] == "ingest_result", done.stderr
        return reply

    reply = wait_until(ask, 30, "the cat's name recalled",
                       until=lambda reply: any("Miso" in m["content"] for m in reply["memories"]))
    assert reply["source"] == "default"  # the service's own engine answered (no plugin configured)


def test_it_answers_with_the_services_plugin(service, daemon):
    make_plugin(service.home / "plugins", "echoer", {"ingest": PY_ECHO_INGEST})
    write_config(service.home, plugin="echoer")
    try:
        reply, done = wait_until(
            lambda: run_hook({"type": "ingest", "agent_id": "bridged", "message": "hello", "peer_id": "u1"}, daemon),
            30, "the service to use its plugin", until=lambda answer: answer[0].get("source") == "echoer")
        # the plugin's memory, after the default engine's recall (by meaning: this agent's nearest memories, if any)
        assert [m["content"] for m in reply["memories"]][-1] == "echo: hello" and done.returncode == 0
    finally:
        write_config(service.home)


def test_it_forwards_assemble_and_bootstrap(daemon):
    messages = [{"role": "user", "content": "hi", "pinned": False},
                {"role": "assistant", "content": "hello", "pinned": False}]
    reply, done = run_hook({"type": "assemble", "agent_id": "bridged", "system_prompt": "Be brief.",
                            "messages": messages, "context_window_tokens": 200000}, daemon)
    assert done.returncode == 0 and reply["type"] == "assemble_result", done.stderr
    assert [m["content"] for m in reply["messages"]][-2:] == ["hi", "hello"]
    reply, done = run_hook({"type": "bootstrap", "context_window_tokens": 200000, "stable_prefix_mode": False,
                            "max_recall_results": 5}, daemon)
    assert done.returncode == 0 and reply["type"] == "ok", done.stderr


@pytest.mark.parametrize(("request_", "default"), [
    ({"type": "ingest", "agent_id": "a", "message": "hi", "peer_id": None},
     {"type": "ingest_result", "memories": []}),
    ({"type": "assemble", "agent_id": "a", "system_prompt": "", "messages": [{"role": "user", "content": "hi"}],
      "context_window_tokens": 1000}, {"type": "assemble_result", "messages": []}),
    ({"type": "compact", "agent_id": "a", "messages": [], "model": "m", "context_window_tokens": 1000},
     {"type": "compact_result", "messages": []}),
    ({"type": "after_turn", "agent_id": "a", "messages": []}, {"type": "ok"}),
    ({"type": "transform_tool_result", "tool_name": "shell", "args": {}, "result": "x", "is_error": False},
     {"type": "skip"}),
])
def test_it_answers_librefangs_default_when_the_service_is_down(request_, default):
    down = {"LIBREFANG_BRIDGE_URL": f"http://127.0.0.1:{free_port()}", "LIBREFANG_BRIDGE_TOKEN": "t",
            "LIBREFANG_BRIDGE_DEADLINE": "1"}
    reply, done = run_hook(request_, down)
    assert (reply, done.returncode) == (default, 0)
    assert "the service did not answer (unreachable" in done.stderr


def test_it_answers_the_default_to_a_token_the_service_refuses(service):
    reply, done = run_hook({"type": "ingest", "agent_id": "a", "message": "hi", "peer_id": None},
                           {"LIBREFANG_BRIDGE_URL": service.url, "LIBREFANG_BRIDGE_TOKEN": "wrong"})
    assert (reply, done.returncode) == ({"type": "ingest_result", "memories": []}, 0)
    assert "HTTP 401" in done.stderr


def test_it_refuses_a_request_that_is_no_hook():
    done = subprocess.run([shutil.which("python3"), "hooks/bridge.py"], input='{"type": "nonsense"}\n',
                          capture_output=True, text=True, cwd=BRIDGE, timeout=30)
    assert done.returncode == 1 and "unknown hook type 'nonsense'" in done.stderr and done.stdout == ""


def test_it_stores_after_turn_through_a_redis_outage_within_its_deadline(tmp_path):
    with service_with_own_redis(tmp_path) as (service, redis):
        daemon = {"LIBREFANG_BRIDGE_URL": service.url, "LIBREFANG_BRIDGE_TOKEN": service.token,
                  "LIBREFANG_BRIDGE_DEADLINE": "25"}
        redis.kill()
        restart = threading.Timer(3.0, redis.start)
        restart.start()
        try:
            reply, done = run_hook({"type": "after_turn", "agent_id": "gym", "messages": [
                {"role": "user", "content": "My locker code is 4711", "pinned": False},
                {"role": "assistant", "content": "Noted.", "pinned": False}]}, daemon)
        finally:
            restart.join()
        assert (reply, done.returncode) == ({"type": "ok"}, 0) and "did not answer" not in done.stderr
        wait_until(lambda: service.request("GET", "/api/memories?agent_id=gym")[1], 30, "the turn stored",
                   until=lambda memories: "4711" in json.dumps(memories))
