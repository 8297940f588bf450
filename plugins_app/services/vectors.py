"""Embedding memories as they are stored, and re-embedding them after a model change.

The memory API and MCP's memory tools embed in the call (an agent that stores then recalls at once finds it);
after_turn's turn memories are queued to `VECTORS`, a writer thread embedding them in batches off the agent's path.
A memory whose embedding fails is stored all the same, recalled by text until `librefang memory reembed` (or the
next write) gives it a vector. Vectors of the configured model only are written; see plugins_app/selectors/recall.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.db import connection, transaction
from django.db.models import F

from engine.embeddings import Embedder, EmbeddingError
from plugins_app.batching import BatchWriter
from plugins_app.home import embedder, required_embedder
from plugins_app.models import Memory, MemoryVector

log = logging.getLogger("librefang.memory")


def store_vectors(memories: list[Memory], emb: Embedder | None = None) -> int:
    """Embed these memories with the configured model and store their vectors; how many were stored (0 when the
    embedder is off or failed: logged, the memories stay recallable by text)."""
    if not memories:
        return 0
    try:
        emb = emb or embedder()
        if emb is None:
            return 0
        vectors = emb.embed([m.content for m in memories])
    except EmbeddingError as exc:
        log.warning("could not embed %d memor%s (recalled by text until re-embedded): %s", len(memories),
                    "y" if len(memories) == 1 else "ies", exc)
        return 0
    _write(memories, vectors, emb)
    return len(memories)


class VectorWriter(BatchWriter[int]):
    """Memory ids queued by after_turn; one thread embeds and stores them in batches."""

    thread_name = "memory-vector-writer"
    batch_max = 128
    linger_secs = 0.05

    def write(self, batch: list[int]) -> None:
        try:
            store_vectors(list(Memory.objects.filter(id__in=batch)))
        finally:  # batches are seconds apart at most: holding a connection between them buys nothing
            connection.close()


VECTORS = VectorWriter()


def missing(model: str, dimensions: int, agent_id: str | None = None):
    """Memories without a current vector of this model (never embedded, embedded by another model, or changed
    since), oldest first."""
    qs = Memory.objects.exclude(vector__model=model, vector__dimensions=dimensions,
                                vector__embedded_at__gte=F("updated_at"))
    if agent_id:
        qs = qs.filter(agent_id=agent_id)
    return qs.order_by("id")


def reembed(batch_size: int = 64, agent_id: str | None = None,
            progress: Callable[[int, int], None] | None = None) -> int:
    """Give every memory a vector of the configured model, in batches; resumable (each batch is committed and only
    memories still missing one are taken). Returns how many were embedded; raises EmbeddingError when the embedder
    fails (what is done stays done)."""
    emb = required_embedder()
    total = missing(emb.model, emb.dimensions, agent_id).count()
    done = 0
    after = 0
    while True:
        batch = list(missing(emb.model, emb.dimensions, agent_id).filter(id__gt=after)[:batch_size])
        if not batch:
            return done
        vectors = emb.embed([m.content for m in batch])  # an EmbeddingError stops here, resumable
        _write(batch, vectors, emb)
        done += len(batch)
        after = batch[-1].id
        if progress:
            progress(done, total)


def _write(memories: list[Memory], vectors: list[list[float]], emb: Embedder) -> None:
    """Replace these memories' vectors (a memory has one, of one model)."""
    import numpy as np  # here, not at import: a process loads it only once something is embedded
    rows = [MemoryVector(memory_id=m.id, model=emb.model, dimensions=len(v),
                         embedding=np.asarray(v, dtype=np.float32).tobytes()) for m, v in zip(memories, vectors, strict=True)]
    with transaction.atomic():
        MemoryVector.objects.filter(memory_id__in=[m.id for m in memories]).delete()
        MemoryVector.objects.bulk_create(rows)
