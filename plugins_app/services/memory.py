"""Writing the default engine's memory store: engine.ports.MemoryStore for the engine (remember each turn, recall
for ingest) and the memory API's writes (create, put by key, update, delete one or a scope). Reads and search:
plugins_app/selectors/memories.py."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from engine.errors import ServiceError
from engine.ports import Recalled
from plugins_app.models import Memory
from plugins_app.selectors.memories import MemoryFilter, recalled, to_dict
from plugins_app.selectors.recall import recall
from plugins_app.services import audit
from plugins_app.services.vectors import VECTORS, store_vectors

log = logging.getLogger("librefang.memory")
REDELIVERY_WINDOW = timedelta(minutes=10)  # an after_turn processed twice must not remember the turn twice


def _scope_fields(agent_id: str, peer_id: str | None, session_id: str | None) -> dict[str, str]:
    return {"agent_id": agent_id[:200], "peer_id": (peer_id or "")[:200], "session_id": (session_id or "")[:200]}


class DbMemoryStore:
    def remember(self, agent_id: str, peer_id: str | None, content: str, scope: str = "hook",
                 tags: list[str] | None = None, source: str = "", *, session_id: str | None = None,
                 metadata: dict[str, Any] | None = None) -> Memory | None:
        """Store one memory; None when it is the same turn remembered again (an after_turn job redelivered)."""
        fields = {**_scope_fields(agent_id, peer_id, session_id), "scope": scope[:200]}
        if scope == "interaction" and Memory.objects.filter(
                **fields, content=content, created_at__gte=timezone.now() - REDELIVERY_WINDOW).exists():
            return None
        m = Memory.objects.create(**fields, content=content, tags=list(tags or [])[:16], source=source[:128],
                                  metadata=dict(metadata or {}))
        VECTORS.put(m.id)  # embedded in batches by the writer thread, off the agent's path
        return m

    def recall(self, agent_id: str, peer_id: str | None, query: str, limit: int,
               session_id: str | None = None) -> list[dict]:
        """Ingest's recall: that peer's and session's memories and the agent's shared ones (no peer or session:
        all of them), best first, each with its id, key, score and times."""
        found = recall(MemoryFilter(agent_id, peer_id or None, session_id or None), query, limit)
        return Recalled([recalled(hit.memory, hit.score) for hit in found.hits], found.fallback)


# ---- the memory API's writes (plugins_app/api/memories.py) ----

class MemoryConflict(ServiceError):
    def __init__(self, existing: Memory):
        super().__init__("conflict", f"the key {existing.key!r} is already used in this scope (memory "
                                     f"{existing.id}); PUT /api/memories replaces it", 409, {"id": existing.id})


def _purge_expired(agent_id: str) -> None:
    """Expired memories are never read; they are deleted when their agent next writes."""
    Memory.objects.filter(agent_id=agent_id, expires_at__lte=timezone.now()).delete()


def _checked_expiry(expires_at: datetime | None) -> datetime | None:
    if expires_at is None:
        return None
    if timezone.is_naive(expires_at):
        expires_at = timezone.make_aware(expires_at, UTC)
    if expires_at <= timezone.now():
        raise ServiceError("validation_error", "expires_at is in the past", 400,
                           {"expires_at": expires_at.isoformat()})
    return expires_at


def create_memory(fields: dict[str, Any], actor: str) -> dict:
    """A new memory (scope: agent_id, peer_id, session_id); a `key` already used in that scope is a 409."""
    scope = _scope_fields(fields["agent_id"], fields.get("peer_id"), fields.get("session_id"))
    tags = list(fields.get("tags") or [])
    key = fields.get("key") or ""
    _purge_expired(scope["agent_id"])
    if key:
        existing = Memory.objects.filter(**scope, key=key).first()
        if existing is not None:
            raise MemoryConflict(existing)
    try:
        with transaction.atomic():
            m = Memory.objects.create(**scope, key=key, content=fields["content"], tags=tags,
                                      scope=",".join(tags)[:200] or "api", metadata=dict(fields.get("metadata") or {}),
                                      source=f"api:{actor}"[:128], expires_at=_checked_expiry(fields.get("expires_at")))
    except IntegrityError:  # the same key written at the same moment by another call
        raise MemoryConflict(Memory.objects.get(**scope, key=key)) from None
    store_vectors([m])
    return to_dict(m)


def put_memory(fields: dict[str, Any], actor: str) -> tuple[dict, bool]:
    """Put by key: the memory with this key in its scope replaced (content, tags, metadata, expiry), or made.
    Returns (memory, created)."""
    scope = _scope_fields(fields["agent_id"], fields.get("peer_id"), fields.get("session_id"))
    tags = list(fields.get("tags") or [])
    _purge_expired(scope["agent_id"])
    values = {"content": fields["content"], "tags": tags, "scope": ",".join(tags)[:200] or "api",
              "metadata": dict(fields.get("metadata") or {}), "expires_at": _checked_expiry(fields.get("expires_at")),
              "source": f"api:{actor}"[:128]}
    m, created = Memory.objects.update_or_create(**scope, key=fields["key"], defaults=values)
    store_vectors([m])
    return to_dict(m), created


def update_memory(m: Memory, changes: dict[str, Any]) -> dict:
    """PATCH: the fields given replace the memory's (metadata and tags whole; `expires_at: null` removes the
    expiry)."""
    if "expires_at" in changes:
        changes = {**changes, "expires_at": _checked_expiry(changes["expires_at"])}
    if "tags" in changes:
        changes = {**changes, "tags": list(changes["tags"] or [])}
    for name, value in changes.items():
        setattr(m, name, value)
    m.save()
    store_vectors([m])  # a vector older than its memory's last change is not used (plugins_app/selectors/recall.py)
    return to_dict(m)


def delete_memory(m: Memory, actor: str) -> dict:
    memory_id = m.id
    m.delete()
    audit.record(actor, "memory.delete", m.agent_id, details={"id": memory_id, "peer_id": m.peer_id,
                                                             "session_id": m.session_id})
    return {"deleted": 1, "id": memory_id, "agent_id": m.agent_id}


def delete_scope(agent_id: str, peer_id: str | None, session_id: str | None, actor: str) -> dict:
    """Every memory of the agent; only that peer's and/or that session's when they are given."""
    qs = Memory.objects.filter(agent_id=agent_id)
    if peer_id:
        qs = qs.filter(peer_id=peer_id)
    if session_id:
        qs = qs.filter(session_id=session_id)
    _, deleted = qs.delete()
    count = deleted.get(Memory._meta.label, 0)  # not their vectors, deleted with them
    audit.record(actor, "memory.delete_agent", agent_id, details={"peer_id": peer_id, "session_id": session_id,
                                                                  "deleted": count})
    return {"deleted": count, "agent_id": agent_id, "peer_id": peer_id, "session_id": session_id}

