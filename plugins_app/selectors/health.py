"""Liveness of the pieces the service depends on."""

from __future__ import annotations

from django.db import connection


def database_ok() -> bool:
    try:
        with connection.cursor() as cur:
            cur.execute("SELECT 1")
        return True
    except Exception:
        return False
