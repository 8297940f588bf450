"""Fixtures for tests whose code under test writes the database from the recording thread."""

import pytest


@pytest.fixture(autouse=True)
def _flush_recording():
    """Traces are written by a background thread: let it finish while this test may still use the database."""
    yield
    from plugins_app.services.engine import invocation_sink

    invocation_sink().flush()


@pytest.fixture(autouse=True, scope="module")
def _release_writer_connection(django_db_blocker):
    """On PostgreSQL the recording thread's connection would stop pytest-django from dropping the test database."""
    yield
    from django.db import connection

    with django_db_blocker.unblock():
        if connection.vendor == "postgresql":
            with connection.cursor() as cur:
                cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                            "WHERE datname = current_database() AND pid <> pg_backend_pid()")
