"""Recall by meaning (plugins_app/selectors/recall.py): the real wordllama embedder, the real database (SQLite here;
PostgreSQL with `DATABASE_URL=postgres://postgres@127.0.0.1:5432/test .venv/bin/pytest tests/app/test_recall.py`),
an OpenAI-compatible endpoint served by a small HTTP server the test starts."""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from engine.embeddings import WordLlamaEmbedder
from plugins_app.models import Memory, MemoryVector
from plugins_app.selectors.memories import MemoryFilter
from plugins_app.selectors.recall import list_memories, recall
from plugins_app.services import memory as memory_service
from plugins_app.services.memory import DbMemoryStore
from plugins_app.services.vectors import VECTORS, reembed

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[2]

FACTS = ["I have a nut allergy", "I drive a red Tesla", "my favourite colour is teal",
         "The quarterly report is due on Friday", "My sister lives in Lisbon"]
QUESTIONS = {"what can't I eat": "I have a nut allergy", "what vehicle do I own": "I drive a red Tesla",
             "what color do I like": "my favourite colour is teal"}


def configure(home, text: str) -> None:
    from plugins_app.home import forget
    (home.root / "config.toml").write_text(text)
    forget()


def remember_all(store, agent="a1", peer=None, facts=FACTS):
    for fact in facts:
        store.remember(agent, peer, fact, scope="interaction")
    VECTORS.flush(timeout=30)


@pytest.fixture
def store(home):
    return DbMemoryStore()


def test_it_recalls_by_meaning_with_no_shared_word(store):
    remember_all(store)
    assert MemoryVector.objects.filter(model=WordLlamaEmbedder.model).count() == len(FACTS)
    for question, fact in QUESTIONS.items():
        rows = store.recall("a1", None, question, 1)
        assert [r["content"] for r in rows] == [fact], question
        assert 0 < rows[0]["score"] <= 1


def test_the_web_process_loads_no_embedding_model_until_something_is_embedded(tmp_path):
    probe = ("import json, sys, django; django.setup(); import librefang_site.web; "
             "print(json.dumps([m for m in ('numpy', 'wordllama', 'tokenizers') if m in sys.modules]))")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "librefang_site.settings", "LIBREFANG_HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=90)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_it_shows_vector_text_and_fused_scores_over_the_api(store):
    remember_all(store)
    page = list_memories(MemoryFilter("a1"), "what vehicle do I own in red", 5)
    assert page["recall"] == {"mode": "hybrid", "fallback": None}
    top = page["items"][0]
    assert top["content"] == "I drive a red Tesla"
    assert top["scores"]["fused"] == top["score"] == 1.0  # first by meaning and by words
    assert 0 < top["scores"]["vector"] <= 1 and 0 < top["scores"]["text"] <= 1
    assert all(0 <= item["score"] <= 1 for item in page["items"])


def test_it_embeds_memories_stored_over_the_api(home):
    made = memory_service.create_memory({"agent_id": "a1", "content": "I have a nut allergy"}, "test")
    assert MemoryVector.objects.filter(memory_id=made["id"]).exists()
    put, _ = memory_service.put_memory({"agent_id": "a1", "key": "car", "content": "I drive a red Tesla"}, "test")
    changed = memory_service.update_memory(Memory.objects.get(id=put["id"]), {"content": "I ride a blue bicycle"})
    page = list_memories(MemoryFilter("a1"), "what vehicle do I own", 5)
    assert page["items"][0]["id"] == changed["id"] and page["items"][0]["content"] == "I ride a blue bicycle"


def test_it_does_not_use_a_vector_older_than_its_memory(store):
    remember_all(store, facts=["I drive a red Tesla"])
    m = Memory.objects.get()
    m.content = "My sister lives in Lisbon"
    m.save()  # not through the memory service: the vector is stale
    assert store.recall("a1", None, "what vehicle do I own", 5) == []
    assert reembed() == 1
    assert [r["content"] for r in store.recall("a1", None, "where does my sibling live", 5)] == [
        "My sister lives in Lisbon"]


def test_it_never_recalls_another_agents_or_peers_memory_by_meaning(store):
    remember_all(store, agent="a1", peer="u1", facts=["I have a nut allergy"])
    remember_all(store, agent="a1", peer="u2", facts=["I am allergic to shellfish"])
    remember_all(store, agent="a2", facts=["I have a peanut allergy"])
    assert [r["content"] for r in store.recall("a1", "u1", "what can't I eat", 10)] == ["I have a nut allergy"]
    assert [r["content"] for r in store.recall("a3", None, "what can't I eat", 10)] == []
    page = list_memories(MemoryFilter("a2"), "what can't I eat", 10)
    assert [i["content"] for i in page["items"]] == ["I have a peanut allergy"]


def test_it_falls_back_to_text_when_the_embedder_is_off(store, home):
    remember_all(store)
    configure(home, '[embeddings]\nprovider = "none"\n')
    page = list_memories(MemoryFilter("a1"), "what vehicle do I own", 5)
    assert page["recall"]["mode"] == "text" and "no embedder" in page["recall"]["fallback"]
    assert page["items"] == []  # no shared word: text alone finds nothing
    assert [r["content"] for r in store.recall("a1", None, "red car", 5)] == ["I drive a red Tesla"]


class EmbeddingServer(http.server.BaseHTTPRequestHandler):
    """An OpenAI-compatible /v1/embeddings that answers with wordllama's vectors (or fails when told to)."""

    fail = False
    calls: list = []

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).calls.append((self.path, self.headers.get("Authorization"), body["model"]))
        if type(self).fail:
            self.send_error(500, "model crashed")
            return
        vectors = WordLlamaEmbedder().embed(body["input"])
        data = {"object": "list", "model": body["model"],
                "data": [{"object": "embedding", "index": i, "embedding": [x * 3 for x in v]}
                         for i, v in reversed(list(enumerate(vectors)))]}
        payload = json.dumps(data).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture
def endpoint(monkeypatch):
    EmbeddingServer.fail, EmbeddingServer.calls = False, []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), EmbeddingServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("TEST_EMBED_KEY", "sk-test")
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def openai_config(url: str, dims: int = 256) -> str:
    return (f'[embeddings]\nprovider = "openai"\nurl = "{url}"\nmodel = "tiny-embed"\ndimensions = {dims}\n'
            f'api_key_env = "TEST_EMBED_KEY"\n')


def test_it_recalls_through_an_openai_compatible_endpoint(store, home, endpoint):
    configure(home, openai_config(endpoint))
    remember_all(store)
    assert MemoryVector.objects.filter(model="openai:tiny-embed").count() == len(FACTS)
    assert [r["content"] for r in store.recall("a1", None, "what color do I like", 1)] == [
        "my favourite colour is teal"]
    assert EmbeddingServer.calls[0] == ("/v1/embeddings", "Bearer sk-test", "tiny-embed")


def test_it_falls_back_to_text_when_the_endpoint_fails_or_is_down(store, home, endpoint):
    configure(home, openai_config(endpoint))
    remember_all(store)
    EmbeddingServer.fail = True
    page = list_memories(MemoryFilter("a1"), "red vehicle", 5)
    assert page["recall"]["mode"] == "text" and "500" in page["recall"]["fallback"]
    assert [i["content"] for i in page["items"]] == ["I drive a red Tesla"]
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    configure(home, openai_config(f"http://127.0.0.1:{closed}/v1"))
    store.remember("a1", None, "I broke my left arm skiing", scope="interaction")  # stored, not embedded
    VECTORS.flush(timeout=30)
    assert Memory.objects.count() == len(FACTS) + 1
    found = recall(MemoryFilter("a1"), "skiing teal", 5)
    assert found.mode == "text" and "refused" in found.fallback.lower()
    assert sorted(h.memory.content for h in found.hits) == ["I broke my left arm skiing", "my favourite colour is teal"]


def test_the_engines_ingest_says_when_it_recalled_by_text_alone(store, home, endpoint):
    from plugins_app.services.engine import get_engine, reset_engine
    configure(home, openai_config(endpoint))
    remember_all(store)
    reset_engine()
    answer = get_engine().handle("ingest", {"agent_id": "a1", "message": "what vehicle do I own"}).to_dict()
    assert answer["source"] == "default" and "warnings" not in answer
    assert [m["content"] for m in answer["memories"]][:1] == ["I drive a red Tesla"]
    EmbeddingServer.fail = True
    answer = get_engine().handle("ingest", {"agent_id": "a1", "message": "red vehicle"}).to_dict()
    assert [m["content"] for m in answer["memories"]] == ["I drive a red Tesla"]
    assert len(answer["warnings"]) == 1 and answer["warnings"][0].startswith("recalled by text alone: ")
    assert "500" in answer["warnings"][0] and "fallback_reason" not in answer  # not a fallback to the default


def test_it_reembeds_on_a_model_change_and_never_mixes_dimensions(store, home, endpoint, capsys):
    remember_all(store)  # wordllama, 256 dimensions
    configure(home, openai_config(endpoint, dims=256))
    # the new model's vectors do not exist yet: vector recall sees none of the old model's, text still works
    assert store.recall("a1", None, "what vehicle do I own", 5) == []
    call_command("memory", "reembed", "--batch-size", "2")
    out = capsys.readouterr().out
    assert "5/5" in out and "openai:tiny-embed" in out
    assert set(MemoryVector.objects.values_list("model", flat=True)) == {"openai:tiny-embed"}
    assert [r["content"] for r in store.recall("a1", None, "what vehicle do I own", 1)] == ["I drive a red Tesla"]
    call_command("memory", "reembed")  # nothing left: resumable means it only takes what is missing
    assert "nothing to re-embed" in capsys.readouterr().out
    configure(home, openai_config(endpoint, dims=128))  # the endpoint answers 256: refused, nothing mixed
    EmbeddingServer.calls = []
    with pytest.raises(CommandError, match="128"):
        call_command("memory", "reembed")
    assert set(MemoryVector.objects.values_list("dimensions", flat=True)) == {256}


def test_it_reembeds_in_batches_and_resumes_after_a_failure(store, home, endpoint):
    remember_all(store)
    configure(home, openai_config(endpoint))
    done = []
    assert reembed(batch_size=2, progress=lambda n, total: done.append((n, total))) == 5
    assert done == [(2, 5), (4, 5), (5, 5)]
    configure(home, '[embeddings]\nprovider = "wordllama"\n')
    assert reembed(batch_size=2) == 5
    assert reembed(batch_size=2) == 0


# ---- the dashboard's memory page ----

def test_it_shows_an_agents_memories_and_a_recalls_scores_on_the_dashboard(client, store):
    from django.contrib.auth.models import User
    remember_all(store)
    store.remember("other", None, "I own a green tractor", scope="interaction")
    VECTORS.flush(timeout=30)
    client.force_login(User.objects.create_user("ops", "", "pw", is_staff=True))  # an admin
    page = client.get("/memories/?agent=a1").content.decode()
    assert "I drive a red Tesla" in page and WordLlamaEmbedder.model in page and "tractor" not in page
    page = client.get("/memories/", {"agent": "a1", "q": "what vehicle do I own"}).content.decode()
    results = page[page.index('id="recall-results"'):page.index('id="stored-h"')]
    first_row = results[results.index("<tbody>"):results.index("</tr>", results.index("<tbody>"))]
    assert "I drive a red Tesla" in first_row  # ranked first
    assert "Recalled by meaning and words" in page and "tractor" not in results
    assert "<script>" not in page and "style=" not in page  # the CSP allows neither


def test_it_says_on_the_dashboard_when_recall_fell_back_to_text(client, store, home):
    from django.contrib.auth.models import User
    remember_all(store)
    configure(home, '[embeddings]\nprovider = "none"\n')
    client.force_login(User.objects.create_user("ops", "", "pw", is_staff=True))
    page = client.get("/memories/", {"agent": "a1", "q": "red car"}).content.decode()
    assert 'id="recall-fallback"' in page and "no embedder configured" in page


def test_it_refuses_the_memory_page_to_viewers_and_anonymous_users(client, store):
    from django.contrib.auth.models import User
    remember_all(store)
    assert client.get("/memories/?agent=a1").status_code == 302
    client.force_login(User.objects.create_user("reader", "", "pw"))
    resp = client.get("/memories/?agent=a1")
    assert resp.status_code == 403 and "I drive a red Tesla" not in resp.content.decode()
