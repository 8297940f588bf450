"""The default engine's DB memory store: real full-text recall (SQLite FTS5 here; PostgreSQL when DATABASE_URL
points at one: `DATABASE_URL=postgres://postgres@127.0.0.1:5432/test .venv/bin/pytest tests/app/test_memory.py`)."""

import pytest
from django.db import connection

from plugins_app.models import Memory
from plugins_app.services.memory import DbMemoryStore, query_terms

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def store():
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
