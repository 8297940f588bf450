"""Recall by meaning: the memories a filter sees, ranked by vector similarity and by full text, merged by
reciprocal rank fusion (engine/embeddings.py `fuse`).

Vectors live in MemoryVector (float32, unit length, the model recorded). The scope filter runs first, in the
database, so the vector ranking only ever sees the memories `MemoryFilter` allows; then an exact cosine scan over
those vectors of the configured model (vectors of another model, or older than their memory's last change, are
skipped, never compared). The same code and the same scores on SQLite and PostgreSQL. When the query cannot be embedded (no embedder, the model failed, the
endpoint is down) recall is full text alone and `Recall.fallback` says why.

Scores are 0..1: `fused` (1 = ranked first by both), `vector` (cosine, clipped at 0) and `text` (the full-text
score of plugins_app/selectors/memories.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from django.db.models import F, QuerySet

from engine.embeddings import EmbeddingError, fuse
from plugins_app.home import required_embedder
from plugins_app.models import Memory, MemoryVector
from plugins_app.selectors.memories import (
    CANDIDATES_PER_RESULT,
    MAX_SEARCH_RESULTS,
    MemoryFilter,
    decode_cursor,
    encode_cursor,
    scoped,
    search,
    to_dict,
)

log = logging.getLogger("librefang.memory")
# A vector pointing away from the query is no candidate; a higher floor would drop memories recall should find
# (bench/recall/run.py measures it).
MIN_COSINE = 0.0


@dataclass
class Hit:
    memory: Memory
    score: float
    vector: float | None = None
    text: float | None = None


@dataclass
class Recall:
    hits: list[Hit] = field(default_factory=list)
    mode: str = "hybrid"  # "hybrid" or "text"
    fallback: str | None = None  # why recall is text only


def as_vector(blob: bytes):
    import numpy as np  # here, not at import: the web process loads it only once something is recalled
    return np.frombuffer(bytes(blob), dtype=np.float32)


def fresh(vectors: QuerySet) -> QuerySet:
    """Vectors made since their memory last changed (one saved with new content is recalled by text until its
    vector is remade)."""
    return vectors.filter(embedded_at__gte=F("memory__updated_at"))


def vector_ranking(f: MemoryFilter, query_vec: list[float], model: str, limit: int) -> list[tuple[int, float]]:
    """(memory id, cosine) of the best `limit` vectors of `model` among the memories `f` sees."""
    rows = list(fresh(MemoryVector.objects.filter(memory_id__in=scoped(f).values("id"), model=model,
                                                  dimensions=len(query_vec))).values_list("memory_id", "embedding"))
    if not rows:
        return []
    import numpy as np
    matrix = np.stack([as_vector(blob) for _, blob in rows])
    sims = matrix @ np.asarray(query_vec, dtype=np.float32)
    order = np.argsort(-sims)[:limit]
    return [(rows[i][0], float(sims[i])) for i in order if sims[i] >= MIN_COSINE]


def recall(f: MemoryFilter, query: str, limit: int) -> Recall:
    """The best `limit` memories `f` sees for `query`, best first."""
    if not query.strip() or limit <= 0:
        return Recall(mode="text")
    candidates = limit * CANDIDATES_PER_RESULT
    text = search(f, query, candidates)
    try:
        emb = required_embedder()
        [query_vec] = emb.embed([query])
        by_vector = vector_ranking(f, query_vec, emb.model, candidates)
    except EmbeddingError as exc:
        log.warning("vector recall unavailable, recalling by text alone: %s", exc)
        return Recall([Hit(m, s, text=s) for m, s in text[:limit]], mode="text", fallback=str(exc))
    text_scores = {m.id: s for m, s in text}
    vector_scores = dict(by_vector)
    fused = fuse([[mid for mid, _ in by_vector], [m.id for m, _ in text]])
    best = sorted(fused, key=lambda mid: (fused[mid], vector_scores.get(mid, 0.0)), reverse=True)[:limit]
    by_id = {m.id: m for m, _ in text} | Memory.objects.in_bulk([mid for mid in best if mid not in text_scores])
    return Recall([Hit(by_id[mid], fused[mid], round(max(0.0, vector_scores[mid]), 4) if mid in vector_scores
                       else None, text_scores.get(mid)) for mid in best if mid in by_id])


def list_memories(f: MemoryFilter, q: str | None, limit: int, offset: int = 0, cursor: str | None = None,
                  oldest_first: bool = False) -> dict:
    """A page of what `f` sees: with `q`, the recall ranked best first, each with its score (fused) and `scores`
    (vector, text, fused), and `recall` saying how it was ranked; else newest (or oldest) first. `next_cursor`
    fetches the next page (null on the last)."""
    position = decode_cursor(cursor) if cursor else {}
    if "after" in position and position.get("asc", 0) != int(oldest_first):
        raise ValueError("this cursor belongs to a listing in the other order")
    if q and q.strip():
        found = recall(f, q, MAX_SEARCH_RESULTS)
        start = position.get("rank", offset)
        page = found.hits[start:start + limit]
        more = start + limit < len(found.hits)
        return {"items": [_hit_dict(hit) for hit in page], "total": len(found.hits), "offset": start,
                "limit": limit, "query": q, "recall": {"mode": found.mode, "fallback": found.fallback},
                "next_cursor": encode_cursor({"rank": start + limit}) if more else None}
    qs = scoped(f)
    total = qs.count()
    ordered = qs.order_by("id" if oldest_first else "-id")
    if "after" in position:
        ordered = ordered.filter(id__gt=position["after"]) if oldest_first else \
            ordered.filter(id__lt=position["after"])
        offset = 0
    items = list(ordered[offset:offset + limit + 1])
    more, items = len(items) > limit, items[:limit]
    return {"items": [to_dict(m) for m in items], "total": total, "offset": offset, "limit": limit, "query": None,
            "next_cursor": encode_cursor({"after": items[-1].id, "asc": int(oldest_first)}) if more else None}


def _hit_dict(hit: Hit) -> dict:
    return {**to_dict(hit.memory, hit.score), "scores": {"vector": hit.vector, "text": hit.text, "fused": hit.score}}
