"""Database connections of the worker's long-lived threads: job threads, the outcome writer, the invocation writer.

Django's close_old_connections closes a connection with CONN_MAX_AGE = 0 (the SQLite default, librefang_site/
settings.py) every time it is called, so a thread that calls it before each job reopened its connection per job:
connect, the WAL pragmas, the SQL functions, more than the job's own queries cost (bench/worker_job.py).
"""

from __future__ import annotations

from django.db import connections

# How long a healthy connection with CONN_MAX_AGE = 0 is kept between jobs (PostgreSQL's CONN_MAX_AGE is 60 too).
REUSE_SECS = 60.0


def refresh_connections() -> None:
    """close_old_connections for a thread that runs one job after another: a connection that is unusable (errors,
    autocommit left off) or older than CONN_MAX_AGE is closed, as there, except that CONN_MAX_AGE = 0 counts as
    REUSE_SECS."""
    for conn in connections.all(initialized_only=True):
        opened = conn.close_at  # with CONN_MAX_AGE = 0, Django sets close_at to the moment it connected
        if conn.settings_dict.get("CONN_MAX_AGE") == 0 and opened is not None:
            conn.close_at = opened + REUSE_SECS
            try:
                conn.close_if_unusable_or_obsolete()
            finally:
                if conn.connection is not None:
                    conn.close_at = opened
        else:
            conn.close_if_unusable_or_obsolete()
