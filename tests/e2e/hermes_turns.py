"""Real Hermes Agent turns for tests/e2e/test_client_hermes.py, run by .venv-hermes's python (Hermes cannot be
installed beside the project's packages): `hermes_turns.py <step>`, with HERMES_HOME, LIBREFANG_URL,
LIBREFANG_TOKEN and LIBREFANG_AGENT_ID set by the test. It prints one JSON object: what each turn answered and what
the model was sent. The model is a scripted OpenAI-compatible endpoint on 127.0.0.1 (no network): Hermes talks to it
through its own client, as it would to any provider.

Steps: `install` (the plugin and config.yaml), `first` (a turn in session monday, then a tool call that remembers a
fact), `later` (a new session that recalls both, a long one that Hermes compresses, and a turn with the service
down)."""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MEMORY_OPEN, MEMORY_CLOSE = "<memory-context>", "</memory-context>"
FACT = "I am vegetarian"


def _text(content) -> str:
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def reply_for(messages: list[dict]) -> dict:
    """The scripted model: repeats a tool's result; for "Remember that ..." / "Look up ..." calls the LibreFang
    tools; otherwise repeats the memory context Hermes recalled into the user's message, or acknowledges."""
    last = messages[-1]
    if last["role"] == "tool":
        return {"content": "Tool said: " + _text(last["content"])}
    said = _text(last["content"])
    if said.startswith("Remember that "):
        fact = said.removeprefix("Remember that ").split("\n")[0]
        return {"tool": "librefang_remember", "arguments": {"content": fact, "key": "diet"}}
    if said.startswith("Look up "):
        return {"tool": "librefang_recall", "arguments": {"query": said.removeprefix("Look up ").split("\n")[0]}}
    if MEMORY_OPEN in said:
        recalled = said.split(MEMORY_OPEN, 1)[1].split(MEMORY_CLOSE, 1)[0]
        lines = [line for line in recalled.splitlines() if line.strip() and not line.startswith("[System note")]
        return {"content": "From memory: " + " / ".join(lines)}
    return {"content": "Noted."}


class ScriptedModel:
    """An OpenAI chat-completions endpoint (streamed or not) answering with `reply_for`; keeps every request."""

    def __init__(self):
        self.requests: list[dict] = []
        model = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):  # Hermes asks the endpoint which models it serves
                self._json({"object": "list", "data": [{"id": "scripted", "object": "model",
                                                        "context_length": 128_000}]})

            def do_POST(self):
                request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                model.requests.append(request)
                reply = reply_for(request["messages"])
                message = {"role": "assistant", "content": reply.get("content")}
                if "tool" in reply:
                    message["tool_calls"] = [{"id": f"call_{len(model.requests)}", "type": "function", "function": {
                        "name": reply["tool"], "arguments": json.dumps(reply["arguments"])}}]
                finish = "tool_calls" if "tool" in reply else "stop"
                usage = {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}
                if not request.get("stream"):
                    self._json({"id": "c", "object": "chat.completion", "created": int(time.time()),
                                "model": "scripted", "usage": usage,
                                "choices": [{"index": 0, "message": message, "finish_reason": finish}]})
                    return
                delta = dict(message)
                if "tool_calls" in delta:
                    delta["tool_calls"] = [{"index": 0, **call} for call in delta["tool_calls"]]
                chunks = [{"choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
                          {"choices": [{"index": 0, "delta": {}, "finish_reason": finish}], "usage": usage}]
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for chunk in chunks:
                    chunk.update({"id": "c", "object": "chat.completion.chunk", "created": int(time.time()),
                                  "model": "scripted"})
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")

            def _json(self, body):
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


class Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record):
        if record.name.startswith("librefang_client"):
            self.lines.append(record.getMessage())


def install() -> dict:
    """The plugin as a user installs it (`python -m librefang_client.adapters.hermes install`) and the config.yaml
    that selects it; threshold_percent in librefang.json makes the long conversation of `later` compress."""
    import subprocess

    home = os.environ["HERMES_HOME"]
    done = subprocess.run([sys.executable, "-m", "librefang_client.adapters.hermes", "install"],
                          capture_output=True, text=True, check=True)
    with open(os.path.join(home, "config.yaml"), "w") as f:
        f.write("model:\n  context_length: 128000\nmemory:\n  provider: librefang\nplugins:\n  enabled: [librefang]\n"
                "context:\n  engine: librefang\n")
    with open(os.path.join(home, "librefang.json"), "w") as f:
        json.dump({"threshold_percent": 0.1}, f)
    return {"installed": done.stdout.strip()}


def new_agent(model: ScriptedModel, session: str):
    from run_agent import AIAgent

    return AIAgent(base_url=model.url, api_key="scripted", model="scripted", quiet_mode=True,
                   skip_context_files=True, enabled_toolsets=["memory"], session_id=session, user_id="alex")


def turn(model: ScriptedModel, agent, message: str, history: list | None = None) -> dict:
    """One turn through Hermes's run_conversation; what it answered and every request the model got meanwhile."""
    first = len(model.requests)
    result = agent.run_conversation(message, conversation_history=history)
    return {"answer": result["final_response"], "sent": [r["messages"] for r in model.requests[first:]]}


def first(model: ScriptedModel) -> dict:
    agent = new_agent(model, "monday")
    registered = {"engine": type(agent.context_compressor).__name__,
                  "memory": [p.name for p in agent._memory_manager.providers] if agent._memory_manager else [],
                  "tools": [t["function"]["name"] for t in agent.tools]}
    said = turn(model, agent, "I'm allergic to hazelnuts")
    remembered = turn(model, agent, f"Remember that {FACT}")
    agent.shutdown_memory_provider()  # the session's end: Hermes drains its background sync_turn
    return {"registered": registered, "said": said, "remembered": remembered}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def later(model: ScriptedModel) -> dict:
    from librefang_client import LibreFang, RetryPolicy
    from librefang_client.adapters.hermes import LibreFangContextEngine, LibreFangMemoryProvider

    out = {}
    agent = new_agent(model, "tuesday")
    out["recalled"] = turn(model, agent, "Which nuts am I allergic to?")
    out["looked_up"] = turn(model, agent, "Look up vegetarian")
    agent.shutdown_memory_provider()

    history = []
    for i in range(15):  # about 18,000 tokens: past 10 % of the 128k window (librefang.json's threshold_percent)
        history += [{"role": "user", "content": f"Tell me about topic {i}. " + "filler words " * 170},
                    {"role": "assistant", "content": f"Topic {i} is interesting. " + "more filler " * 170}]
    history += [{"role": "user", "content": "Look up topic 14"},  # a tool call among the messages the service keeps
                {"role": "assistant", "content": "", "tool_calls": [{"id": "call_t14", "type": "function", "function": {
                    "name": "librefang_recall", "arguments": '{"query": "topic 14"}'}}]},
                {"role": "tool", "tool_call_id": "call_t14", "content": '{"results": []}'},
                {"role": "assistant", "content": "Nothing more on topic 14."}]
    agent = new_agent(model, "wednesday")
    out["compressed"] = turn(model, agent, "And what about topic 15?", history)
    out["compression_count"] = agent.context_compressor.compression_count
    agent.shutdown_memory_provider()

    caught = Warnings()
    logging.getLogger("librefang_client").addHandler(caught)
    os.environ["LIBREFANG_URL"] = f"http://127.0.0.1:{free_port()}"  # the memory provider reads it per agent
    agent = new_agent(model, "thursday")
    out["down"] = turn(model, agent, "Which nuts am I allergic to?")
    agent.shutdown_memory_provider()
    down = LibreFang(os.environ["LIBREFANG_URL"], "t", retry=RetryPolicy(max_retries=0))
    messages = history[:4]
    out["down_compress_unchanged"] = LibreFangContextEngine(client=down).compress(messages) is messages
    provider = LibreFangMemoryProvider(client=down)  # what Hermes's background worker runs after a turn
    provider.initialize("friday", hermes_home=os.environ["HERMES_HOME"])
    provider.sync_turn("I'm allergic to hazelnuts", "Noted.", session_id="friday")
    out["warnings"] = caught.lines
    return out


def main() -> None:
    step = sys.argv[1]
    if step == "install":
        print(json.dumps(install()))
        return
    model = ScriptedModel()
    print(json.dumps({"first": first, "later": later}[step](model)))


if __name__ == "__main__":
    main()
