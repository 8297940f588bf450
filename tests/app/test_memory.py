"""The default engine's DB memory store: real full-text recall, the embedder off (SQLite FTS5 here; PostgreSQL when
DATABASE_URL points at one: `DATABASE_URL=postgres://postgres@127.0.0.1:5432/test .venv/bin/pytest tests/app/test_memory.py`)."""

import json

import pytest
from django.db import connection

from plugins_app.models import Memory
from plugins_app.selectors.memories import query_terms
from plugins_app.services.memory import DbMemoryStore

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def store(home):
    """Full text alone: recall by meaning and its fusion with this ranking are tests/app/test_recall.py's."""
    from plugins_app.home import forget
    (home.root / "config.toml").write_text('[embeddings]\nprovider = "none"\n')
    forget()
    return DbMemoryStore()


def contents(rows):
    return [r["content"] for r in rows]


def test_it_uses_the_vendors_full_text_index(store):
    store.remember("a1", None, "The deploy key rotates every Tuesday")
    assert connection.vendor in ("sqlite", "postgresql")
    with connection.cursor() as cur:
        if connection.vendor == "sqlite":
            cur.execute("SELECT count(*) FROM plugins_app_memory_fts WHERE plugins_app_memory_fts MATCH 'rotat*'")
        else:
            cur.execute("SELECT count(*) FROM pg_indexes WHERE indexname = 'plugins_app_memory_fts_gin'")
        assert cur.fetchone()[0] == 1


def test_it_recalls_by_words_with_stemming_and_ranks_best_first(store):
    store.remember("a1", None, "User prefers Rust for systems programming")
    store.remember("a1", None, "User's cat is called Miso")
    store.remember("a1", None, "Rust programs compile slowly but Rust is memory safe")
    rows = store.recall("a1", None, "what do I think about rust programming?", 5)
    assert set(contents(rows)) == {"User prefers Rust for systems programming",
                                   "Rust programs compile slowly but Rust is memory safe"}
    assert rows[0]["scope"] == "default_recall" and rows[0]["score"] >= rows[1]["score"]
    # stemming: "cats" finds "cat"
    assert contents(store.recall("a1", None, "cats", 5)) == ["User's cat is called Miso"]


def test_it_scopes_recall_by_agent_and_peer(store):
    store.remember("a1", "peer-x", "peer x likes tea")
    store.remember("a1", "peer-y", "peer y likes coffee")
    store.remember("a1", None, "everyone likes biscuits")
    store.remember("a2", None, "agent two likes tea too")
    assert sorted(contents(store.recall("a1", "peer-x", "likes tea coffee biscuits", 10))) == [
        "everyone likes biscuits", "peer x likes tea"]
    assert sorted(contents(store.recall("a1", None, "likes", 10))) == [
        "everyone likes biscuits", "peer x likes tea", "peer y likes coffee"]
    assert contents(store.recall("a3", None, "tea", 10)) == []


def test_it_honours_the_limit_and_empty_queries(store):
    for i in range(8):
        store.remember("a1", None, f"note number {i} about gardening")
    assert len(store.recall("a1", None, "gardening", 5)) == 5
    assert store.recall("a1", None, "the and of", 5) == []
    assert store.recall("a1", None, "gardening", 0) == []


def test_it_treats_query_syntax_as_plain_words(store):
    store.remember("a1", None, "NEAR the OR gate AND the NOT gate")
    rows = store.recall("a1", None, 'gate" OR * NEAR( AND ) -x ^ \' \\', 5)
    assert contents(rows) == ["NEAR the OR gate AND the NOT gate"]


def test_it_keeps_the_index_in_sync_on_update_and_delete(store):
    store.remember("a1", None, "old fact about llamas")
    m = Memory.objects.get()
    m.content = "new fact about alpacas"
    m.save()
    assert store.recall("a1", None, "llamas", 5) == []
    assert contents(store.recall("a1", None, "alpacas", 5)) == ["new fact about alpacas"]
    m.delete()
    assert store.recall("a1", None, "alpacas", 5) == []


def test_query_terms_drop_stopwords_and_duplicates():
    assert query_terms("The cat and THE cat sat on a mat") == ["cat", "sat", "mat"]


def test_it_scores_relevance_between_0_and_1_even_in_a_tiny_store(store):
    # one memory: bm25's IDF is ~0 here, the score must still say "this matched"
    store.remember("a1", None, "The staging database lives on host db-7")
    (only,) = store.recall("a1", None, "the staging database?", 5)
    assert 0.5 <= only["score"] <= 1.0


def test_it_scores_a_memory_holding_more_of_the_query_higher(store):
    store.remember("a1", None, "Kafka topics are partitioned")
    store.remember("a1", None, "Kafka consumer lag alert fires at 10k messages on the orders topic")
    store.remember("a1", None, "Lunch is at noon")
    rows = store.recall("a1", None, "kafka consumer lag on orders", 5)
    assert contents(rows) == ["Kafka consumer lag alert fires at 10k messages on the orders topic",
                              "Kafka topics are partitioned"]
    best, other = rows
    assert 0 < other["score"] < best["score"] <= 1.0
    assert other["score"] <= 0.5  # one word in four


def test_it_remembers_a_redelivered_turn_once(store):
    assert store.remember("a1", "u1", "User: hi\nAssistant: hello", scope="interaction") is not None
    assert store.remember("a1", "u1", "User: hi\nAssistant: hello", scope="interaction") is None
    assert store.remember("a1", "u2", "User: hi\nAssistant: hello", scope="interaction") is not None
    assert Memory.objects.count() == 2


# ---- the default engine remembers, and the memory API (in-process; tests/e2e/test_default_memory.py runs the same
# round trip through a real worker) ----

TURN = [{"role": "user", "content": "Our Kafka cluster runs on three brokers in eu-west"},
        {"role": "assistant", "content": [{"type": "text", "text": "Noted: three Kafka brokers in eu-west."}]}]


@pytest.fixture
def api(client, home):
    from plugins_app.models import Role
    from plugins_app.services.tokens import create_token

    tokens = {role: create_token(role, role)[1] for role in (Role.OWNER, Role.ADMIN, Role.VIEWER, Role.AGENT)}

    def request(method, path, body=None, role="agent", **extra):
        kw = {"HTTP_AUTHORIZATION": f"Bearer {tokens[role]}"}
        fn = getattr(client, method.lower())
        if body is None:
            return fn("/api" + path, **kw, **extra)
        return fn("/api" + path, data=json.dumps(body), content_type="application/json", **kw, **extra)
    return request


def test_it_recalls_a_default_mode_turn_with_a_score_then_lists_and_deletes_it(api, home):
    from plugins_app.services.engine import get_engine

    engine = get_engine()
    assert engine.chain() == []  # no plugin configured: the default engine answers
    engine.handle("after_turn", {"agent_id": "agent-7", "peer_id": "u1", "messages": TURN})
    engine.handle("after_turn", {"agent_id": "agent-8", "peer_id": "u1", "messages": TURN})  # another agent
    recalled = engine.handle("ingest", {"agent_id": "agent-7", "peer_id": "u1",
                                        "message": "how many kafka brokers do we have?"}).result["memories"]
    assert [m["content"] for m in recalled] == [
        "User: Our Kafka cluster runs on three brokers in eu-west\nAssistant: Noted: three Kafka brokers in eu-west."]
    assert 0 < recalled[0]["score"] <= 1 and recalled[0]["scope"] == "default_recall"
    r = api("GET", "/memories?agent_id=agent-7&peer_id=u1&q=kafka+brokers")
    assert r.status_code == 200, r.content
    body = r.json()
    assert body["total"] == 1 and body["items"][0]["agent_id"] == "agent-7" and body["items"][0]["score"] > 0
    assert body["items"][0]["scope"] == "interaction" and body["items"][0]["source"] == "default"
    mem_id = body["items"][0]["id"]
    r = api("DELETE", f"/memories/{mem_id}")
    assert r.status_code == 200 and r.json() == {"deleted": 1, "id": mem_id, "agent_id": "agent-7"}
    assert engine.handle("ingest", {"agent_id": "agent-7", "peer_id": "u1",
                                    "message": "kafka brokers?"}).result["memories"] == []
    assert api("DELETE", f"/memories/{mem_id}").status_code == 404
    assert Memory.objects.filter(agent_id="agent-8").count() == 1  # the other agent keeps its memory


def test_it_creates_pages_and_scopes_memories_over_the_api(api, home):
    for i in range(5):
        r = api("POST", "/memories", {"agent_id": "a1", "peer_id": "p1", "content": f"fact {i} about llamas",
                                      "tags": ["zoo"]})
        assert r.status_code == 201 and r.json()["scope"] == "zoo"
    api("POST", "/memories", {"agent_id": "a1", "content": "peer-less fact about llamas"})
    api("POST", "/memories", {"agent_id": "a1", "peer_id": "p2", "content": "p2 fact about llamas"})
    page = api("GET", "/memories?agent_id=a1&peer_id=p1&limit=2&offset=0").json()
    assert page["total"] == 6 and len(page["items"]) == 2  # p1's five and the peer-less one, not p2's
    assert page["items"][0]["content"] == "peer-less fact about llamas"  # newest first
    rest = api("GET", "/memories?agent_id=a1&peer_id=p1&limit=10&offset=2").json()["items"]
    assert len(rest) == 4 and not {m["id"] for m in rest} & {m["id"] for m in page["items"]}
    assert api("GET", "/memories?agent_id=a1").json()["total"] == 7
    assert api("GET", "/memories").status_code == 400  # agent_id is required
    assert api("POST", "/memories", {"agent_id": "a1", "content": ""}).status_code == 400
    # an agent may forget a scope of its own memories; admins any agent's; viewers read none
    r = api("DELETE", "/memories?agent_id=a1&peer_id=p1")
    assert r.status_code == 200 and r.json()["deleted"] == 5
    assert api("GET", "/memories?agent_id=a1").json()["total"] == 2
    assert api("DELETE", "/memories?agent_id=a1&peer_id=p2", role="admin").json()["deleted"] == 1
    assert api("GET", "/memories?agent_id=a1", role="viewer").status_code == 403


def test_it_gets_updates_and_puts_memories_by_key(api, home):
    r = api("POST", "/memories", {"agent_id": "a1", "session_id": "s1", "key": "diet", "content": "vegetarian",
                                  "tags": ["pref"], "metadata": {"kind": "preference", "confidence": 0.9}})
    assert r.status_code == 201, r.content
    made = r.json()
    assert made["key"] == "diet" and made["session_id"] == "s1" and made["metadata"]["kind"] == "preference"
    # the same key in the same scope: create refuses, put replaces
    conflict = api("POST", "/memories", {"agent_id": "a1", "session_id": "s1", "key": "diet", "content": "x"})
    assert conflict.status_code == 409 and conflict.json()["error"]["details"] == {"id": made["id"]}
    r = api("PUT", "/memories", {"agent_id": "a1", "session_id": "s1", "key": "diet", "content": "vegan"})
    assert r.status_code == 200 and r.json()["id"] == made["id"] and r.json()["content"] == "vegan"
    assert r.json()["metadata"] == {} and r.json()["updated_at"] > made["updated_at"]
    # another scope: another memory with the same key
    other = api("PUT", "/memories", {"agent_id": "a1", "session_id": "s2", "key": "diet", "content": "omnivore"})
    assert other.status_code == 201 and other.json()["id"] != made["id"]
    # get and patch by id
    assert api("GET", f"/memories/{made['id']}").json()["content"] == "vegan"
    r = api("PATCH", f"/memories/{made['id']}", {"metadata": {"kind": "diet"}, "tags": ["food"]})
    assert r.status_code == 200 and r.json()["metadata"] == {"kind": "diet"} and r.json()["tags"] == ["food"]
    assert r.json()["content"] == "vegan"  # untouched
    assert api("PATCH", f"/memories/{made['id']}", {"content": None}).status_code == 400
    assert api("PATCH", f"/memories/{made['id']}", {"colour": "red"}).status_code == 400  # unknown field
    assert api("POST", "/memories", {"agent_id": "a1", "content": "x", "metdata": {}}).status_code == 400
    assert api("GET", "/memories/999999").status_code == 404


def test_it_filters_by_session_key_tags_and_metadata(api, home):
    def add(content, **fields):
        assert api("POST", "/memories", {"agent_id": "a1", "content": content, **fields}).status_code == 201

    add("likes tea", peer_id="u1", session_id="s1", tags=["drink", "pref"], metadata={"kind": "pref", "n": 1})
    add("likes jazz", peer_id="u1", session_id="s2", tags=["music", "pref"], metadata={"kind": "pref", "n": 2})
    add("shared fact", metadata={"kind": "fact", "ok": True})

    def contents(query):
        r = api("GET", "/memories?agent_id=a1&" + query)
        assert r.status_code == 200, r.content
        return sorted(m["content"] for m in r.json()["items"])

    assert contents("session_id=s1") == ["likes tea", "shared fact"]  # the session's and the session-less
    assert contents("session_id=s1&include_shared=false") == ["likes tea"]
    assert contents("peer_id=u1&include_shared=false") == ["likes jazz", "likes tea"]
    assert contents("tags=pref&tags=music") == ["likes jazz"]
    assert contents('metadata={"kind":"pref"}') == ["likes jazz", "likes tea"]
    assert contents('metadata={"n":2}') == ["likes jazz"]
    assert contents('metadata={"ok":true}') == ["shared fact"]
    assert contents("q=tea+jazz&session_id=s2&include_shared=false") == ["likes jazz"]
    assert api("GET", "/memories?agent_id=a1&metadata=[1]").status_code == 400
    assert api("GET", "/memories?agent_id=a1&tag=pref").status_code == 400  # a misspelt filter is no silent no-op
    scopes = api("GET", "/memories/scopes?agent_id=a1").json()["scopes"]
    assert scopes == [{"peer_id": None, "session_id": None, "count": 1},
                      {"peer_id": "u1", "session_id": "s1", "count": 1},
                      {"peer_id": "u1", "session_id": "s2", "count": 1}]


def test_it_pages_with_cursors_and_refuses_offsets_out_of_range(api, home):
    for i in range(5):
        api("POST", "/memories", {"agent_id": "a1", "content": f"fact {i}"})
    seen, cursor = [], None
    while True:
        r = api("GET", "/memories?agent_id=a1&limit=2" + (f"&cursor={cursor}" if cursor else "")).json()
        seen += [m["content"] for m in r["items"]]
        cursor = r["next_cursor"]
        if cursor is None:
            break
    assert seen == [f"fact {i}" for i in (4, 3, 2, 1, 0)]
    oldest = api("GET", "/memories?agent_id=a1&limit=3&order=oldest").json()
    assert [m["content"] for m in oldest["items"]] == ["fact 0", "fact 1", "fact 2"]
    rest = api("GET", f"/memories?agent_id=a1&order=oldest&cursor={oldest['next_cursor']}").json()
    assert [m["content"] for m in rest["items"]] == ["fact 3", "fact 4"] and rest["next_cursor"] is None
    assert api("GET", f"/memories?agent_id=a1&cursor={oldest['next_cursor']}").status_code == 400  # other order
    assert api("GET", "/memories?agent_id=a1&cursor=bogus").json()["error"]["code"] == "invalid_cursor"
    for query in (f"offset={2**63}", f"offset={10**7}", "limit=0"):
        r = api("GET", f"/memories?agent_id=a1&{query}")
        assert r.status_code == 400 and r.json()["error"]["code"] == "validation_error", query
    assert api("GET", f"/memories/{2**63}").status_code == 400


def test_it_forgets_expired_memories(api, home):
    from datetime import timedelta

    from django.utils import timezone

    soon = (timezone.now() + timedelta(hours=1)).isoformat()
    made = api("POST", "/memories", {"agent_id": "a1", "content": "temporary code 77", "expires_at": soon}).json()
    assert made["expires_at"] is not None
    past = (timezone.now() - timedelta(seconds=1)).isoformat()
    assert api("POST", "/memories", {"agent_id": "a1", "content": "x", "expires_at": past}).status_code == 400
    Memory.objects.filter(id=made["id"]).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert api("GET", "/memories?agent_id=a1").json()["total"] == 0
    assert api("GET", "/memories?agent_id=a1&q=temporary").json()["total"] == 0
    assert api("GET", f"/memories/{made['id']}").status_code == 404
    assert DbMemoryStore().recall("a1", None, "temporary code", 5) == []


def test_it_recalls_with_ids_keys_and_times_within_a_session(store):
    store.remember("a1", "u1", "the deploy window is friday", session_id="s1", metadata={"src": "chat"})
    store.remember("a1", "u1", "the deploy freeze starts monday", session_id="s2")
    rows = store.recall("a1", "u1", "deploy", 5, session_id="s1")
    assert [r["content"] for r in rows] == ["the deploy window is friday"]
    assert {"id", "key", "score", "created_at", "updated_at", "metadata"} <= rows[0].keys()
    assert rows[0]["metadata"] == {"src": "chat"}
    assert len(store.recall("a1", "u1", "deploy", 5)) == 2  # no session: every session's
