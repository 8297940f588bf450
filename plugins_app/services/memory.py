"""The default engine's memory store in the database: engine.ports.MemoryStore.

Recall ranks stored memories of the same agent (and peer, when given) by how many query words they contain.
"""

from __future__ import annotations

import re

from django.db.models import Q

from plugins_app.models import Memory

_WORD = re.compile(r"\w{3,}", re.UNICODE)
STOPWORDS = frozenset(["the", "and", "for", "that", "this", "with", "what", "was", "were", "are", "you", "your", "have", "has", "had", "not", "but", "from", "about"])


def query_terms(text: str, limit: int = 12) -> list[str]:
    seen: dict[str, None] = {}
    for w in _WORD.findall(text.lower()):
        if w not in STOPWORDS:
            seen.setdefault(w)
    return list(seen)[:limit]


class DbMemoryStore:
    def remember(self, agent_id: str, peer_id: str | None, content: str, scope: str = "hook",
                 tags: list[str] | None = None, source: str = "") -> None:
        Memory.objects.create(agent_id=agent_id[:200], peer_id=(peer_id or "")[:200], content=content,
                              scope=scope[:200], tags=list(tags or [])[:16], source=source[:128])

    def recall(self, agent_id: str, peer_id: str | None, query: str, limit: int) -> list[dict]:
        terms = query_terms(query)
        if not terms or limit <= 0:
            return []
        qs = Memory.objects.filter(agent_id=agent_id)
        if peer_id:
            qs = qs.filter(Q(peer_id=peer_id) | Q(peer_id=""))
        match = Q()
        for t in terms:
            match |= Q(content__icontains=t)
        candidates = list(qs.filter(match).order_by("-created_at")[:500])
        scored = []
        for m in candidates:
            low = m.content.lower()
            score = sum(1 for t in terms if t in low)
            scored.append((score, m.created_at, m))
        scored.sort(key=lambda x: (x[0], x[1]), reverse=True)
        return [{"content": m.content, "scope": "default_recall", "source": m.source or "memory",
                 "score": s / len(terms)} for s, _, m in scored[:limit]]
