"""The default engine's memory store in the database: engine.ports.MemoryStore.

Recall is real full-text search, chosen by database vendor (tables and indexes come from migration 0002):
- SQLite: FTS5 (porter stemming), ranked by bm25;
- PostgreSQL: to_tsvector('english', content) @@ to_tsquery(...) over a GIN index, ranked by ts_rank;
- anything else, or FTS unavailable: a LIKE scan ranked by how many query words a memory contains.
Query words are OR-ed (any word may match) and the best `limit` memories win. Scope: the agent's memories; when a
peer_id is given, that peer's memories plus the agent's peer-less ones.

Scores are 0..1: coverage x (0.5 + 0.5 x r / (1 + r)), where coverage is the share of query words the memory
contains (as the index's stemmer sees them) and r the vendor's rank (-bm25 on SQLite, ts_rank on PostgreSQL). bm25
alone is not enough: on a small store a word found in most memories gets an IDF of ~0, so every score would be ~0.
"""

from __future__ import annotations

import logging
import re
from datetime import timedelta

from django.db import DatabaseError, connection, transaction
from django.db.models import Q
from django.utils import timezone

from plugins_app.models import Memory
from plugins_app.services import audit

log = logging.getLogger("librefang.memory")
_WORD = re.compile(r"\w{2,}", re.UNICODE)
STOPWORDS = frozenset(["the", "and", "for", "that", "this", "with", "what", "was", "were", "are", "you", "your",
                       "have", "has", "had", "not", "but", "from", "about", "is", "it", "of", "to", "in", "on",
                       "a", "an", "do", "does", "did", "my", "me", "we", "our", "be", "at", "as", "or", "so"])
MAX_TERMS = 16
CANDIDATES_PER_RESULT = 4  # rows ranked by the index, re-ordered by the normalised score
REDELIVERY_WINDOW = timedelta(minutes=10)  # an after_turn processed twice must not remember the turn twice


def query_terms(text: str, limit: int = MAX_TERMS) -> list[str]:
    seen: dict[str, None] = {}
    for w in _WORD.findall(text.lower()):
        if w not in STOPWORDS:
            seen.setdefault(w)
    return list(seen)[:limit]


def _scope_sql(agent_id: str, peer_id: str | None) -> tuple[str, list]:
    if peer_id:
        return "m.agent_id = %s AND (m.peer_id = %s OR m.peer_id = '')", [agent_id, peer_id]
    return "m.agent_id = %s", [agent_id]


def relevance(coverage: float, rank: float) -> float:
    rank = max(0.0, float(rank or 0.0))
    return round(max(0.0, min(1.0, coverage)) * (0.5 + 0.5 * rank / (1.0 + rank)), 4)


class DbMemoryStore:
    def remember(self, agent_id: str, peer_id: str | None, content: str, scope: str = "hook",
                 tags: list[str] | None = None, source: str = "") -> Memory | None:
        """Store one memory; None when it is the same turn remembered again (an after_turn job redelivered)."""
        fields = {"agent_id": agent_id[:200], "peer_id": (peer_id or "")[:200], "scope": scope[:200]}
        if scope == "interaction" and Memory.objects.filter(
                **fields, content=content, created_at__gte=timezone.now() - REDELIVERY_WINDOW).exists():
            return None
        return Memory.objects.create(**fields, content=content, tags=list(tags or [])[:16], source=source[:128])

    def recall(self, agent_id: str, peer_id: str | None, query: str, limit: int) -> list[dict]:
        return [{k: v for k, v in r.items() if k in ("content", "scope", "source", "score")}
                for r in self.search(agent_id, peer_id, query, limit)]

    def search(self, agent_id: str, peer_id: str | None, query: str, limit: int) -> list[dict]:
        """The best `limit` memories for the query, best first, each with its id, created_at and score."""
        terms = query_terms(query)
        if not terms or limit <= 0:
            return []
        vendor = connection.vendor
        candidates = limit * CANDIDATES_PER_RESULT
        try:
            if vendor == "sqlite":
                rows = self._sqlite(agent_id, peer_id, terms, candidates)
            elif vendor == "postgresql":
                rows = self._postgres(agent_id, peer_id, terms, candidates)
            else:
                rows = None
        except DatabaseError as exc:  # e.g. FTS5 missing from this SQLite build
            log.warning("full-text recall failed on %s, using a LIKE scan: %s", vendor, exc)
            rows = None
        if rows is None:
            rows = self._like(agent_id, peer_id, terms, candidates)
        by_id = Memory.objects.in_bulk([r[0] for r in rows])
        out = []
        for mem_id, matched, rank in rows:
            m = by_id.get(mem_id)
            if m is not None:
                out.append({"id": m.id, "content": m.content, "scope": "default_recall", "source": m.source or "memory",
                            "score": relevance(matched / len(terms), rank), "created_at": m.created_at})
        out.sort(key=lambda r: (r["score"], r["created_at"]), reverse=True)
        return out[:limit]

    def _sqlite(self, agent_id, peer_id, terms, limit):
        def quoted(t):
            return '"' + t.replace('"', '""') + '"'
        where, params = _scope_sql(agent_id, peer_id)
        # one IN (MATCH) per word: how many of the query's words this memory holds, by the FTS tokenizer's stemming
        matched = " + ".join(["(m.id IN (SELECT rowid FROM plugins_app_memory_fts WHERE plugins_app_memory_fts "
                              "MATCH %s))"] * len(terms))
        sql = (f"SELECT m.id, {matched} AS matched, -bm25(plugins_app_memory_fts) AS rank "
               f"FROM plugins_app_memory_fts JOIN plugins_app_memory m ON m.id = plugins_app_memory_fts.rowid "
               f"WHERE plugins_app_memory_fts MATCH %s AND {where} "
               f"ORDER BY bm25(plugins_app_memory_fts), m.created_at DESC LIMIT %s")
        with connection.cursor() as cur:  # no atomic(): BEGIN IMMEDIATE would take SQLite's write lock
            cur.execute(sql, [*(quoted(t) for t in terms), " OR ".join(quoted(t) for t in terms), *params, limit])
            return cur.fetchall()

    def _postgres(self, agent_id, peer_id, terms, limit):
        def lexeme(t):  # each term quoted as a lexeme; english stemming/stopwords are applied by to_tsquery
            return "'" + t.replace("'", "''").replace("\\", "") + "'"
        where, params = _scope_sql(agent_id, peer_id)
        matched = " + ".join(["(to_tsvector('english', m.content) @@ to_tsquery('english', %s))::int"] * len(terms))
        sql = (f"SELECT m.id, {matched} AS matched, ts_rank(to_tsvector('english', m.content), q) AS rank "
               f"FROM plugins_app_memory m, to_tsquery('english', %s) q "
               f"WHERE to_tsvector('english', m.content) @@ q AND {where} "
               f"ORDER BY rank DESC, m.created_at DESC LIMIT %s")
        with transaction.atomic(), connection.cursor() as cur:  # savepoint: a failure can't poison the caller
            cur.execute(sql, [*(lexeme(t) for t in terms), " | ".join(lexeme(t) for t in terms), *params, limit])
            return cur.fetchall()

    def _like(self, agent_id, peer_id, terms, limit):
        qs = _scoped(agent_id, peer_id)
        match = Q()
        for t in terms:
            match |= Q(content__icontains=t)
        rows = []
        for m in qs.filter(match).order_by("-created_at")[:500]:
            low = m.content.lower()
            rows.append((m.id, sum(1 for t in terms if t in low), 0.0))
        rows.sort(key=lambda r: r[1], reverse=True)
        return rows[:limit]


def _scoped(agent_id: str, peer_id: str | None):
    qs = Memory.objects.filter(agent_id=agent_id)
    if peer_id:
        qs = qs.filter(Q(peer_id=peer_id) | Q(peer_id=""))
    return qs


# ---- the memory API (plugins_app/api/memories.py) ----

MAX_SEARCH_RESULTS = 500


def to_dict(m: Memory, score: float | None = None) -> dict:
    out = {"id": m.id, "agent_id": m.agent_id, "peer_id": m.peer_id or None, "content": m.content, "scope": m.scope,
           "tags": m.tags, "source": m.source, "created_at": m.created_at.isoformat()}
    if score is not None:
        out["score"] = score
    return out


def create_memory(agent_id: str, peer_id: str | None, content: str, tags: list[str], actor: str) -> dict:
    m = DbMemoryStore().remember(agent_id, peer_id, content, scope=",".join(tags) or "api", tags=tags,
                                 source=f"api:{actor}"[:128])
    assert m is not None  # only scope "interaction" is deduplicated
    return to_dict(m)


def list_memories(agent_id: str, peer_id: str | None, q: str | None, offset: int, limit: int) -> dict:
    """The memories this agent would recall for this peer (the peer's and the agent's peer-less ones; all of the
    agent's when no peer). With `q`: the search ranked best first, each with its score; else newest first."""
    if q and q.strip():
        found = DbMemoryStore().search(agent_id, peer_id, q, MAX_SEARCH_RESULTS)
        page = found[offset:offset + limit]
        by_id = Memory.objects.in_bulk([r["id"] for r in page])
        items = [to_dict(by_id[r["id"]], r["score"]) for r in page if r["id"] in by_id]
        return {"items": items, "total": len(found), "offset": offset, "limit": limit, "query": q}
    qs = _scoped(agent_id, peer_id).order_by("-created_at", "-id")
    return {"items": [to_dict(m) for m in qs[offset:offset + limit]], "total": qs.count(), "offset": offset,
            "limit": limit, "query": None}


def delete_memory(memory_id: int, actor: str) -> dict | None:
    m = Memory.objects.filter(id=memory_id).first()
    if m is None:
        return None
    m.delete()
    audit.record(actor, "memory.delete", m.agent_id, details={"id": memory_id, "peer_id": m.peer_id})
    return {"deleted": 1, "id": memory_id, "agent_id": m.agent_id}


def delete_agent_memories(agent_id: str, peer_id: str | None, actor: str) -> dict:
    """Every memory of the agent (only that peer's when peer_id is given)."""
    qs = Memory.objects.filter(agent_id=agent_id)
    if peer_id:
        qs = qs.filter(peer_id=peer_id)
    count, _ = qs.delete()
    audit.record(actor, "memory.delete_agent", agent_id, details={"peer_id": peer_id, "deleted": count})
    return {"deleted": count, "agent_id": agent_id, "peer_id": peer_id}
