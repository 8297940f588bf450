"""Compaction through an OpenAI-compatible endpoint configured in config.toml [llm]: a small real HTTP server
stands in for the LLM provider (the only fake: it is outside the product)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from plugins_app.services.engine import get_engine
from tests.app.recording_fixtures import _flush_recording, _release_writer_connection  # noqa: F401
from tests.plugin_factory import make_plugin, write_config

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def llm_server():
    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
            if "explode" in body["messages"][-1]["content"]:
                self.send_response(500)
                self.end_headers()
                return
            answer = {"choices": [{"message": {"role": "assistant", "content": "  LLM: user asked about kafka  "}}]}
            data = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1", seen
    server.shutdown()
    server.server_close()


def msgs(n, word="kafka"):
    return [{"role": "user", "content": f"question {i} about {word}"} for i in range(n)]


def test_it_compacts_with_the_configured_llm(home, llm_server, monkeypatch):
    url, seen = llm_server
    monkeypatch.setenv("LIBREFANG_LLM_API_KEY", "sk-test")
    write_config(home.root, extra=f'[llm]\nbase_url = "{url}"\nmodel = "tiny-model"')
    reply = get_engine().handle("compact", {"agent_id": "a", "messages": msgs(13)})
    assert reply.source == "default"
    assert reply.result["summary"] == "LLM: user asked about kafka" and reply.result["used_fallback"] is False
    assert reply.result["compacted_count"] == 3 and len(reply.result["messages"]) == 10
    req = seen[0]
    assert req["path"] == "/v1/chat/completions" and req["auth"] == "Bearer sk-test"
    assert req["body"]["model"] == "tiny-model" and req["body"]["temperature"] == 0.3
    assert req["body"]["messages"][1]["content"] == "\n".join(f"user: question {i} about kafka" for i in range(3))


def test_it_falls_back_to_the_extractive_summary_when_the_llm_fails_or_is_not_configured(home, llm_server):
    url, _ = llm_server
    write_config(home.root, extra=f'[llm]\nbase_url = "{url}"\nmodel = "tiny-model"')
    reply = get_engine().handle("compact", {"agent_id": "a", "messages": msgs(12, "explode")})
    assert reply.result["used_fallback"] is True
    assert reply.result["summary"] == "user: question 0 about explode | user: question 1 about explode"
    write_config(home.root)
    reply = get_engine().handle("compact", {"agent_id": "a", "messages": msgs(12)})
    assert reply.result["used_fallback"] is True


def test_it_answers_a_plugins_request_llm_summary_with_the_host_llm(home, llm_server):
    url, seen = llm_server
    src = """
    import json, sys
    req = json.loads(sys.stdin.read())
    m = req["messages"]
    print(json.dumps({"request_llm_summary": {"summarize": m[:-1], "keep": m[-1:], "prompt": "PLUGIN PROMPT"}}))
    """
    make_plugin(home.plugins_dir, "asks-llm", {"compact": src})
    write_config(home.root, plugin="asks-llm", extra=f'[llm]\nbase_url = "{url}"\nmodel = "tiny-model"')
    reply = get_engine().handle("compact", {"agent_id": "a", "messages": msgs(3)})
    assert reply.source == "asks-llm"
    assert reply.result == {"type": "compact_result", "messages": msgs(3)[-1:], "summary": "LLM: user asked about kafka",
                            "compacted_count": 2, "used_fallback": False}
    assert seen[-1]["body"]["messages"][0] == {"role": "system", "content": "PLUGIN PROMPT"}
