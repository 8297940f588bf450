"""plugins_app/services/connections.py: a worker thread keeps a healthy database connection between jobs, and
closes one that is broken or too old, as Django's close_old_connections would."""

from __future__ import annotations

import time

import pytest
from django.db import connections as django_connections
from django.db.backends.sqlite3.base import DatabaseWrapper

from plugins_app.services import connections


@pytest.fixture
def wrapper(tmp_path, monkeypatch, django_db_blocker):
    """A real SQLite file connection with the given CONN_MAX_AGE, the only one refresh_connections sees."""
    made = []

    def make(max_age: int = 0) -> DatabaseWrapper:
        settings = {**django_connections["default"].settings_dict, "NAME": str(tmp_path / "w.sqlite3"),
                    "CONN_MAX_AGE": max_age}
        w = DatabaseWrapper(settings, alias="worker_test")
        w.ensure_connection()
        made.append(w)
        return w

    class Handler:
        def all(self, initialized_only=False):
            return made

    monkeypatch.setattr(connections, "connections", Handler())
    with django_db_blocker.unblock():  # its own file, not the test database
        yield make
        for w in made:
            w.close()


def test_a_healthy_connection_is_kept_and_django_would_still_close_it(wrapper):
    w = wrapper(0)
    raw, close_at = w.connection, w.close_at
    connections.refresh_connections()
    assert w.connection is raw and w.close_at == close_at
    w.close_if_unusable_or_obsolete()  # Django's own check (close_old_connections) is left as it was
    assert w.connection is None


def test_a_connection_older_than_reuse_secs_is_closed(wrapper):
    w = wrapper(0)
    w.close_at = time.monotonic() - connections.REUSE_SECS - 1
    connections.refresh_connections()
    assert w.connection is None


def test_a_connection_left_outside_autocommit_is_closed(wrapper):
    w = wrapper(0)
    w.set_autocommit(False)
    connections.refresh_connections()
    assert w.connection is None


def test_conn_max_age_other_than_zero_is_djangos_rule(wrapper):
    w = wrapper(60)
    raw = w.connection
    connections.refresh_connections()
    assert w.connection is raw
    w.close_at = time.monotonic() - 1
    connections.refresh_connections()
    assert w.connection is None
