"""The audit trail: one AuditEntry per change, whoever made it (dashboard user, API token or CLI)."""

from __future__ import annotations

import logging
from typing import Any

from plugins_app.models import AuditEntry

log = logging.getLogger("librefang.audit")


def record(actor: str, action: str, target: str = "", *, ok: bool = True, details: dict[str, Any] | None = None) -> None:
    try:
        AuditEntry.objects.create(actor=(actor or "unknown")[:150], action=action[:50], target=(target or "")[:200],
                                  ok=ok, details=details or {})
    except Exception:  # the audit must never turn a done change into an error
        log.exception("could not write audit entry %s %s", action, target)

