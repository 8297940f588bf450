import pytest


@pytest.fixture(autouse=True)
def vectors_in_the_callers_thread(monkeypatch):
    """after_turn's memories are embedded by a writer thread in the service (plugins_app/services/vectors.py). In a
    test process every thread shares one in-memory SQLite database in shared-cache mode, where a lock held by one
    connection fails another's statement at once ("database table is locked") instead of waiting: the writer
    thread's read of a memory could fail the test's own DELETE of it. Here the memory is embedded in the caller's
    thread, on the test's connection; the thread itself is exercised by the e2e tests' real service."""
    from plugins_app.models import Memory
    from plugins_app.services import vectors

    monkeypatch.setattr(vectors.VECTORS, "put",
                        lambda memory_id: vectors.store_vectors(list(Memory.objects.filter(id=memory_id))))
