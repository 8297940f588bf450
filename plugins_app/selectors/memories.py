"""Reading the default engine's memory store: the scopes, the filters and full-text search.

A memory belongs to an agent and, optionally, a peer and a session ("" when none). `MemoryFilter` says which
memories a read sees: always one agent's; with a peer_id, that peer's plus (`include_shared`, LibreFang's filter)
the agent's peer-less ones; without one, every peer's. The same for session_id. Expired memories are never seen.

Search is real full-text search, chosen by database vendor (tables and indexes come from migration 0002):
- SQLite: FTS5 (porter stemming), ranked by bm25;
- PostgreSQL: to_tsvector('english', content) @@ to_tsquery(...) over a GIN index, ranked by ts_rank;
- anything else, or FTS unavailable: a LIKE scan ranked by how many query words a memory contains.
Query words are OR-ed (any word may match) and the best `limit` memories win, among those the filter sees.

Scores are 0..1: coverage x (0.5 + 0.5 x r / (1 + r)), where coverage is the share of query words the memory
contains (as the index's stemmer sees them) and r the vendor's rank (-bm25 on SQLite, ts_rank on PostgreSQL). bm25
alone is not enough: on a small store a word found in most memories gets an IDF of ~0, so every score would be ~0.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import re
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, connection, transaction
from django.db.models import BooleanField, Count, Q, QuerySet
from django.db.models.expressions import RawSQL
from django.db.models.fields.json import KeyTransform
from django.utils import timezone

from engine.errors import ServiceError
from plugins_app.auth import may_act_for
from plugins_app.models import ApiToken, Memory

log = logging.getLogger("librefang.memory")
_WORD = re.compile(r"\w{2,}", re.UNICODE)
STOPWORDS = frozenset(["the", "and", "for", "that", "this", "with", "what", "was", "were", "are", "you", "your",
                       "have", "has", "had", "not", "but", "from", "about", "is", "it", "of", "to", "in", "on",
                       "a", "an", "do", "does", "did", "my", "me", "we", "our", "be", "at", "as", "or", "so"])
MAX_TERMS = 16
CANDIDATES_PER_RESULT = 4  # rows ranked by the index, re-ordered by the normalised score
MAX_SEARCH_RESULTS = 500  # a search answers at most this many, in pages
METADATA_KEY = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


@dataclass(frozen=True)
class MemoryFilter:
    """Which memories a read sees (see the module docstring)."""

    agent_id: str
    peer_id: str | None = None
    session_id: str | None = None
    include_shared: bool = True
    key: str | None = None
    tags: tuple[str, ...] = ()
    metadata: tuple[tuple[str, Any], ...] = ()  # (key, value): equality on the memory's metadata


def live() -> Q:
    return Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now())


def scoped(f: MemoryFilter) -> QuerySet:
    """The live memories `f` sees."""
    qs = Memory.objects.filter(live(), agent_id=f.agent_id)
    for field, value in (("peer_id", f.peer_id), ("session_id", f.session_id)):
        if value:
            qs = qs.filter(**{f"{field}__in": [value, ""] if f.include_shared else [value]})
    if f.key is not None:
        qs = qs.filter(key=f.key)
    for tag in f.tags:
        qs = qs.filter(_has_tag(tag))
    for i, (name, value) in enumerate(f.metadata):
        qs = qs.alias(**{f"meta_{i}": KeyTransform(name, "metadata")}).filter(**{f"meta_{i}": value})
    return qs


def _has_tag(tag: str) -> Q:
    if connection.vendor == "sqlite":  # SQLite's JSON has no containment operator
        return Q(RawSQL('EXISTS (SELECT 1 FROM json_each("plugins_app_memory"."tags") WHERE json_each.value = %s)',
                        [tag], output_field=BooleanField()))
    return Q(tags__contains=[tag])


def to_dict(m: Memory, score: float | None = None) -> dict:
    """A memory as the memory API shows it."""
    out = {"id": m.id, "agent_id": m.agent_id, "peer_id": m.peer_id or None, "session_id": m.session_id or None,
           "key": m.key or None, "content": m.content, "scope": m.scope, "tags": m.tags, "metadata": m.metadata,
           "source": m.source, "created_at": m.created_at.isoformat(), "updated_at": m.updated_at.isoformat(),
           "expires_at": m.expires_at.isoformat() if m.expires_at else None}
    if score is not None:
        out["score"] = score
    return out


def recalled(m: Memory, score: float) -> dict:
    """A memory as ingest recalls it (engine/default_engine.py): what an agent needs to show, cite or change it."""
    return {"id": m.id, "key": m.key or None, "content": m.content, "scope": "default_recall",
            "source": m.source or "memory", "score": score, "tags": m.tags, "metadata": m.metadata,
            "created_at": m.created_at.isoformat(), "updated_at": m.updated_at.isoformat()}


def get_memory(memory_id: int) -> Memory | None:
    return Memory.objects.filter(live(), id=memory_id).first()


def visible_memory(token: ApiToken, memory_id: int) -> Memory:
    """The memory if `token` may see its agent; a 404 otherwise (another agent's memory does not exist for it)."""
    m = get_memory(memory_id)
    if m is None or not may_act_for(token, m.agent_id):
        raise ServiceError("not_found", f"memory {memory_id} does not exist", 404)
    return m


def metadata_filter(value: Any) -> tuple[tuple[str, Any], ...]:
    """A list's metadata filter checked: a JSON object of top-level keys to the values they must equal."""
    if value is None:
        return ()
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and METADATA_KEY.fullmatch(k) and (v is None or isinstance(v, str | int | float | bool))
            for k, v in value.items()):
        raise ServiceError("validation_error", "metadata must be a JSON object of keys (letters, digits, _.:-) to "
                                               "strings, numbers, booleans or null", 400, {"loc": ["metadata"]})
    return tuple(value.items())


# ---- listing, with cursors ----

def encode_cursor(data: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps(data, separators=(",", ":")).encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> dict:
    """A cursor's content; ValueError for one this service did not make."""
    try:
        data = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (ValueError, binascii.Error, UnicodeDecodeError) as exc:
        raise ValueError("not a cursor from this API") from exc
    if not isinstance(data, dict) or not all(isinstance(data.get(k), int) and data[k] >= 0 for k in data) or not data:
        raise ValueError("not a cursor from this API")
    return data


def scopes(agent_id: str) -> list[dict]:
    """The (peer, session) scopes an agent has live memories in, with how many."""
    rows = (Memory.objects.filter(live(), agent_id=agent_id).values("peer_id", "session_id")
            .annotate(count=Count("id")).order_by("peer_id", "session_id"))
    return [{"peer_id": r["peer_id"] or None, "session_id": r["session_id"] or None, "count": r["count"]}
            for r in rows]


# ---- full-text search ----

def query_terms(text: str, limit: int = MAX_TERMS) -> list[str]:
    seen: dict[str, None] = {}
    for w in _WORD.findall(text.lower()):
        if w not in STOPWORDS:
            seen.setdefault(w)
    return list(seen)[:limit]


def relevance(coverage: float, rank: float) -> float:
    rank = max(0.0, float(rank or 0.0))
    return round(max(0.0, min(1.0, coverage)) * (0.5 + 0.5 * rank / (1.0 + rank)), 4)


def search(f: MemoryFilter, query: str, limit: int) -> list[tuple[Memory, float]]:
    """The best `limit` memories `f` sees for the query, best first, with their scores."""
    terms = query_terms(query)
    if not terms or limit <= 0:
        return []
    vendor = connection.vendor
    candidates = limit * CANDIDATES_PER_RESULT
    within = scoped(f).values("id").query.sql_with_params()
    try:
        if vendor == "sqlite":
            rows = _sqlite(within, terms, candidates)
        elif vendor == "postgresql":
            rows = _postgres(within, terms, candidates)
        else:
            rows = None
    except DatabaseError as exc:  # e.g. FTS5 missing from this SQLite build
        log.warning("full-text recall failed on %s, using a LIKE scan: %s", vendor, exc)
        rows = None
    if rows is None:
        rows = _like(f, terms, candidates)
    by_id = Memory.objects.in_bulk([r[0] for r in rows])
    out = [(by_id[mem_id], relevance(matched / len(terms), rank)) for mem_id, matched, rank in rows
           if mem_id in by_id]
    out.sort(key=lambda r: (r[1], r[0].created_at), reverse=True)
    return out[:limit]


def _sqlite(within, terms, limit):
    def quoted(t):
        return '"' + t.replace('"', '""') + '"'
    sub, sub_params = within
    # one IN (MATCH) per word: how many of the query's words this memory holds, by the FTS tokenizer's stemming
    matched = " + ".join(["(m.id IN (SELECT rowid FROM plugins_app_memory_fts WHERE plugins_app_memory_fts "
                          "MATCH %s))"] * len(terms))
    sql = (f"SELECT m.id, {matched} AS matched, -bm25(plugins_app_memory_fts) AS rank "
           f"FROM plugins_app_memory_fts JOIN plugins_app_memory m ON m.id = plugins_app_memory_fts.rowid "
           f"WHERE plugins_app_memory_fts MATCH %s AND m.id IN ({sub}) "
           f"ORDER BY bm25(plugins_app_memory_fts), m.created_at DESC LIMIT %s")
    with connection.cursor() as cur:  # no atomic(): BEGIN IMMEDIATE would take SQLite's write lock
        cur.execute(sql, [*(quoted(t) for t in terms), " OR ".join(quoted(t) for t in terms), *sub_params, limit])
        return cur.fetchall()


def _postgres(within, terms, limit):
    def lexeme(t):  # each term quoted as a lexeme; english stemming/stopwords are applied by to_tsquery
        return "'" + t.replace("'", "''").replace("\\", "") + "'"
    sub, sub_params = within
    matched = " + ".join(["(to_tsvector('english', m.content) @@ to_tsquery('english', %s))::int"] * len(terms))
    sql = (f"SELECT m.id, {matched} AS matched, ts_rank(to_tsvector('english', m.content), q) AS rank "
           f"FROM plugins_app_memory m, to_tsquery('english', %s) q "
           f"WHERE to_tsvector('english', m.content) @@ q AND m.id IN ({sub}) "
           f"ORDER BY rank DESC, m.created_at DESC LIMIT %s")
    with transaction.atomic(), connection.cursor() as cur:  # savepoint: a failure can't poison the caller
        cur.execute(sql, [*(lexeme(t) for t in terms), " | ".join(lexeme(t) for t in terms), *sub_params, limit])
        return cur.fetchall()


def _like(f: MemoryFilter, terms, limit):
    match = Q()
    for t in terms:
        match |= Q(content__icontains=t)
    rows = []
    for m in scoped(f).filter(match).order_by("-created_at")[:500]:
        low = m.content.lower()
        rows.append((m.id, sum(1 for t in terms if t in low), 0.0))
    rows.sort(key=lambda r: r[1], reverse=True)
    return rows[:limit]


def agents_with_memories(limit: int = 500) -> list[dict]:
    """Agents that have live memories, with how many (the dashboard's memory page)."""
    rows = (Memory.objects.filter(live()).values("agent_id").annotate(count=Count("id")).order_by("agent_id"))
    return [{"agent_id": r["agent_id"], "count": r["count"]} for r in rows[:limit]]


def newest(agent_id: str, limit: int = 50) -> list[Memory]:
    """An agent's newest live memories, each with its vector's model (`vector_model`, None when it has none)."""
    rows = list(Memory.objects.filter(live(), agent_id=agent_id).select_related("vector").order_by("-id")[:limit])
    for m in rows:
        m.vector_model = m.vector.model if hasattr(m, "vector") else None  # no row: RelatedObjectDoesNotExist
    return rows
