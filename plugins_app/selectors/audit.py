"""The audit log, filtered and paged (for the Tokens & audit page: plugins_app/templates/plugins_app/partials/audit_log.html)."""

from __future__ import annotations

import datetime as dt

from django.core.paginator import Paginator
from django.db.models import Q
from django.utils import timezone

from plugins_app.models import AuditEntry

PER_PAGE = 50
SINCE = {"1h": dt.timedelta(hours=1), "24h": dt.timedelta(hours=24), "7d": dt.timedelta(days=7),
         "30d": dt.timedelta(days=30)}


def audit_log(params, per_page: int = PER_PAGE) -> dict:
    """One page of audit entries matching the request's GET parameters:

    `actor` (substring), `action` (exact), `q` (target or details text), `result` ("ok" | "failed"),
    `since` (1h, 24h, 7d, 30d), `page`. Returns entries, the page, the filters as given, the known actions and
    the query string without `page` (for pager links)."""
    qs = AuditEntry.objects.all()
    actor = (params.get("actor") or "").strip()
    action = (params.get("action") or "").strip()
    text = (params.get("q") or "").strip()
    result = params.get("result") or ""
    since = params.get("since") or ""
    if actor:
        qs = qs.filter(actor__icontains=actor)
    if action:
        qs = qs.filter(action=action)
    if text:
        qs = qs.filter(Q(target__icontains=text) | Q(details__icontains=text))
    if result in ("ok", "failed"):
        qs = qs.filter(ok=result == "ok")
    if since in SINCE:
        qs = qs.filter(at__gte=timezone.now() - SINCE[since])
    page = Paginator(qs, per_page).get_page(params.get("page") or 1)
    rest = params.copy() if hasattr(params, "copy") else dict(params)
    rest.pop("page", None)
    return {
        "entries": list(page.object_list), "page": page, "count": page.paginator.count,
        "filters": {"actor": actor, "action": action, "q": text, "result": result, "since": since},
        "actions": sorted(AuditEntry.objects.values_list("action", flat=True).distinct()),
        "since_choices": list(SINCE),
        "query_string": rest.urlencode() if hasattr(rest, "urlencode") else "",
    }
