"""The alerts page: the rules config.toml sets, each alert's current state, the webhooks, the history, and a button
that sends a test message (plugins_app/services/alerts.py)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.views.decorators.http import require_GET, require_POST

from plugins_app.selectors import alerts as alert_selectors
from plugins_app.services import alerts as alert_service
from plugins_app.views.roles import actor, role_required


def _context(tested=None) -> dict:
    return {"config": alert_selectors.config(), "rules": alert_selectors.RULES, "states": alert_selectors.states(),
            "history": alert_selectors.history(), "tested": tested}


@login_required
@require_GET
def alerts_page(request):
    return render(request, "plugins_app/alerts.html", _context())


@login_required
@require_POST
@role_required("alerts_test")
def alerts_test(request):
    event = alert_service.send_test(actor(request))
    template = "plugins_app/partials/alert_test_result.html" if request.htmx else "plugins_app/alerts.html"
    return render(request, template, _context(tested=event))
