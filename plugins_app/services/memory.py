"""The default engine's memory store in the database: engine.ports.MemoryStore.

Recall is real full-text search, chosen by database vendor (tables and indexes come from migration 0002):
- SQLite: FTS5 (porter stemming), ranked by bm25;
- PostgreSQL: to_tsvector('english', content) @@ to_tsquery(...) over a GIN index, ranked by ts_rank;
- anything else, or FTS unavailable: a LIKE scan ranked by how many query words a memory contains.
Query words are OR-ed (any word may match) and the best `limit` memories win. Scope: the agent's memories; when a
peer_id is given, that peer's memories plus the agent's peer-less ones.
"""

from __future__ import annotations

import logging
import re

from django.db import DatabaseError, connection, transaction
from django.db.models import Q

from plugins_app.models import Memory

log = logging.getLogger("librefang.memory")
_WORD = re.compile(r"\w{2,}", re.UNICODE)
STOPWORDS = frozenset(["the", "and", "for", "that", "this", "with", "what", "was", "were", "are", "you", "your",
                       "have", "has", "had", "not", "but", "from", "about", "is", "it", "of", "to", "in", "on",
                       "a", "an", "do", "does", "did", "my", "me", "we", "our", "be", "at", "as", "or", "so"])
MAX_TERMS = 16


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


class DbMemoryStore:
    def remember(self, agent_id: str, peer_id: str | None, content: str, scope: str = "hook",
                 tags: list[str] | None = None, source: str = "") -> None:
        Memory.objects.create(agent_id=agent_id[:200], peer_id=(peer_id or "")[:200], content=content,
                              scope=scope[:200], tags=list(tags or [])[:16], source=source[:128])

    def recall(self, agent_id: str, peer_id: str | None, query: str, limit: int) -> list[dict]:
        terms = query_terms(query)
        if not terms or limit <= 0:
            return []
        vendor = connection.vendor
        try:
            if vendor == "sqlite":
                rows = self._sqlite(agent_id, peer_id, terms, limit)
            elif vendor == "postgresql":
                rows = self._postgres(agent_id, peer_id, terms, limit)
            else:
                rows = None
        except DatabaseError as exc:  # e.g. FTS5 missing from this SQLite build
            log.warning("full-text recall failed on %s, using a LIKE scan: %s", vendor, exc)
            rows = None
        if rows is None:
            rows = self._like(agent_id, peer_id, terms, limit)
        return [{"content": content, "scope": "default_recall", "source": source or "memory", "score": round(score, 4)}
                for content, source, score in rows]

    def _sqlite(self, agent_id, peer_id, terms, limit):
        match = " OR ".join('"' + t.replace('"', '""') + '"' for t in terms)
        where, params = _scope_sql(agent_id, peer_id)
        sql = (f"SELECT m.content, m.source, -bm25(plugins_app_memory_fts) AS score "
               f"FROM plugins_app_memory_fts JOIN plugins_app_memory m ON m.id = plugins_app_memory_fts.rowid "
               f"WHERE plugins_app_memory_fts MATCH %s AND {where} "
               f"ORDER BY bm25(plugins_app_memory_fts), m.created_at DESC LIMIT %s")
        with connection.cursor() as cur:  # no atomic(): BEGIN IMMEDIATE would take SQLite's write lock
            cur.execute(sql, [match, *params, limit])
            return cur.fetchall()

    def _postgres(self, agent_id, peer_id, terms, limit):
        where, params = _scope_sql(agent_id, peer_id)
        sql = (f"SELECT m.content, m.source, ts_rank(to_tsvector('english', m.content), q) AS score "
               f"FROM plugins_app_memory m, to_tsquery('english', %s) q "
               f"WHERE to_tsvector('english', m.content) @@ q AND {where} "
               f"ORDER BY score DESC, m.created_at DESC LIMIT %s")
        # each term quoted as a lexeme; english stemming/stopwords are applied by to_tsquery
        tsquery = " | ".join("'" + t.replace("'", "''").replace("\\", "") + "'" for t in terms)
        with transaction.atomic(), connection.cursor() as cur:  # savepoint: a failure can't poison the caller
            cur.execute(sql, [tsquery, *params, limit])
            return cur.fetchall()

    def _like(self, agent_id, peer_id, terms, limit):
        qs = Memory.objects.filter(agent_id=agent_id)
        if peer_id:
            qs = qs.filter(Q(peer_id=peer_id) | Q(peer_id=""))
        match = Q()
        for t in terms:
            match |= Q(content__icontains=t)
        scored = []
        for m in qs.filter(match).order_by("-created_at")[:500]:
            low = m.content.lower()
            scored.append((sum(1 for t in terms if t in low) / len(terms), m.created_at, m))
        scored.sort(key=lambda x: (x[0], x[1]), reverse=True)
        return [(m.content, m.source, s) for s, _, m in scored[:limit]]
