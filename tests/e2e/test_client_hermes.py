"""librefang_client.adapters.hermes with the real Hermes Agent (hermes-agent from PyPI, pinned in
clients/python/hermes-requirements.lock): real turns through Hermes's run_conversation, with a scripted model
endpoint of the test's own (no network), against a live service. The plugin is installed and selected the way a
Hermes user does it; the first session stores, a new session recalls through Hermes's own prompt assembly, the
model's tool calls reach the memory API, and Hermes's compression goes through the service's compact.

Hermes runs in .venv-hermes (`make setup` builds it; it cannot be installed beside the project's packages):
tests/e2e/hermes_turns.py drives it there and reports what each turn answered and what the model was sent."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest
from librefang_client import LibreFang

from tests.e2e.live import REPO, running_service
from tests.waiting import wait_until

HERMES_PYTHON = REPO / ".venv-hermes" / "bin" / "python"
DRIVER = Path(__file__).with_name("hermes_turns.py")

pytestmark = pytest.mark.skipif(not HERMES_PYTHON.exists(),
                                reason="no .venv-hermes: `make setup` builds it from hermes-requirements.lock")


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    with running_service(tmp_path_factory.mktemp("hermes")) as live:
        yield live


@pytest.fixture(scope="module")
def hermes(service, tmp_path_factory):
    """Runs one step of the driver in .venv-hermes, with a Hermes home (and HOME) of its own."""
    root = tmp_path_factory.mktemp("hermes-home")
    env = {**os.environ, "HOME": str(root), "HERMES_HOME": str(root / ".hermes"), "LIBREFANG_URL": service.url,
           "LIBREFANG_TOKEN": service.token, "LIBREFANG_AGENT_ID": f"hermes-{uuid.uuid4().hex[:8]}"}
    for name in ("VIRTUAL_ENV", "PYTHONPATH", "OPENAI_API_KEY", "OPENROUTER_API_KEY"):
        env.pop(name, None)
    (root / ".hermes").mkdir()

    def run(step: str) -> dict:
        done = subprocess.run([str(HERMES_PYTHON), str(DRIVER), step], env=env, cwd=root, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, f"hermes_turns.py {step} failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
        return json.loads(done.stdout.strip().splitlines()[-1])

    run.agent_id = env["LIBREFANG_AGENT_ID"]
    run.home = root / ".hermes"
    return run


def user_message(request: list[dict]) -> str:
    return [m for m in request if m["role"] == "user"][-1]["content"]


def test_hermes_remembers_a_session_recalls_it_in_the_next_and_compresses_through_the_service(service, hermes):
    installed = hermes("install")
    assert (hermes.home / "plugins" / "librefang" / "plugin.yaml").exists()
    assert "installed" in installed["installed"]

    first = hermes("first")
    assert first["registered"]["engine"] == "LibreFangContextEngine"  # context.engine: librefang
    assert first["registered"]["memory"] == ["librefang"]  # memory.provider: librefang
    assert {"librefang_recall", "librefang_remember"} <= set(first["registered"]["tools"])
    assert first["said"]["answer"] == "Noted."
    system = first["said"]["sent"][0][0]
    assert system["role"] == "system" and "# LibreFang memory" in system["content"]  # system_prompt_block

    # the model's librefang_remember call went through Hermes's tool dispatch to the memory API
    remembered = first["remembered"]
    assert [m["role"] for m in remembered["sent"][1][-2:]] == ["assistant", "tool"]
    assert '"key": "diet"' in remembered["answer"] and "I am vegetarian" in remembered["answer"]

    lf = LibreFang(service.url, service.token)
    (fact,) = lf.memories.list(hermes.agent_id, key="diet").items
    assert (fact.content, fact.peer_id, fact.tags) == ("I am vegetarian", "alex", ["hermes"])

    # sync_turn -> after_turn: stored by a worker a moment after its 202
    wait_until(lambda: lf.memories.list(hermes.agent_id, session_id="monday", include_shared=False).items, 30,
               "the session's two turns stored", until=lambda items: len(items) >= 2)
    turns = {m.content for m in lf.memories.list(hermes.agent_id, session_id="monday").items if m.key is None}
    assert "User: I'm allergic to hazelnuts\nAssistant: Noted." in turns
    assert all(m.peer_id == "alex" for m in lf.memories.list(hermes.agent_id).items)

    later = hermes("later")
    # a new session: prefetch (ingest) recalled the first session into the user message Hermes sent the model
    recalled = later["recalled"]
    sent = user_message(recalled["sent"][0])
    assert sent.startswith("Which nuts am I allergic to?\n\n<memory-context>")
    assert "- User: I'm allergic to hazelnuts" in sent
    assert recalled["answer"].startswith("From memory: ") and "allergic to hazelnuts" in recalled["answer"]

    looked_up = later["looked_up"]  # the model's librefang_recall call: the memory API's search
    tool_result = json.loads(looked_up["sent"][1][-1]["content"])
    assert tool_result["results"][0]["content"] == "I am vegetarian"

    # Hermes's preflight compression called the engine: the service's compact kept the last messages and its
    # summary of the others (the default engine's extractive one) came first
    compressed = later["compressed"]["sent"][0]
    assert later["compression_count"] == 1
    assert compressed[0]["role"] == "system"
    assert compressed[1]["role"] == "user" and compressed[1]["content"].startswith("[Context compaction summary]")
    assert "user: Tell me about topic 0 | assistant: Topic 0 is interesting" in compressed[1]["content"]
    kept = compressed[2:-1]  # the service's last 10 (the new message is the 10th), as Hermes held them
    assert [m["content"].split(".")[0] for m in kept[:6]] == [
        "Topic 12 is interesting", "Tell me about topic 13", "Topic 13 is interesting", "Tell me about topic 14",
        "Topic 14 is interesting", "Look up topic 14"]
    (call,) = kept[6]["tool_calls"]  # Hermes re-serialises the arguments it sends: compared as JSON
    assert (call["id"], call["function"]["name"]) == ("call_t14", "librefang_recall")
    assert json.loads(call["function"]["arguments"]) == {"query": "topic 14"}
    assert (kept[7]["role"], kept[7]["tool_call_id"], kept[8]["content"]) == ("tool", "call_t14",
                                                                               "Nothing more on topic 14.")
    assert user_message(compressed).startswith("And what about topic 15?")

    # the service unreachable: the turn goes on without recall, and compress returns the history unchanged
    assert later["down"]["answer"] == "Noted."
    assert "<memory-context>" not in user_message(later["down"]["sent"][0])
    assert later["down_compress_unchanged"] is True
    assert any("recalled nothing" in w for w in later["warnings"])
    assert any("did not store the turn" in w for w in later["warnings"])
    assert any("did not compact" in w for w in later["warnings"])

