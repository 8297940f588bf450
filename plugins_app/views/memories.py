"""The default engine's memories per agent (admins): what is stored, each memory's vector model, and a "try a
recall" box showing each result's vector, text and fused scores (plugins_app/selectors/recall.py)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.views.decorators.http import require_GET

from plugins_app.selectors import memories as memory_selectors
from plugins_app.selectors import recall as recall_selectors
from plugins_app.views.roles import role_required

RECALL_LIMIT = 10


@login_required
@require_GET
@role_required("admin")
def memories_page(request):
    agent = request.GET.get("agent", "").strip()[:200]
    query = request.GET.get("q", "").strip()[:2000]
    peer = request.GET.get("peer", "").strip()[:200]
    found = None
    if agent and query:
        found = recall_selectors.recall(memory_selectors.MemoryFilter(agent, peer or None), query, RECALL_LIMIT)
    return render(request, "plugins_app/memories.html", {
        "agents": memory_selectors.agents_with_memories(), "agent": agent, "query": query, "peer": peer,
        "memories": memory_selectors.newest(agent) if agent else [], "found": found,
    })
