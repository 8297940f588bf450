"""The alerts page: the rules config.toml sets (admins edit them here), each alert's current state, the webhooks, the
history, and a button that sends a test message (plugins_app/services/alerts.py)."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from plugins_app.forms import AlertRulesForm
from plugins_app.selectors import alerts as alert_selectors
from plugins_app.services import alerts as alert_service
from plugins_app.views.roles import actor, role_required


def _context(tested=None, form=None) -> dict:
    config = alert_selectors.config()
    return {"config": config, "rules": alert_selectors.RULES, "states": alert_selectors.states(),
            "history": alert_selectors.history(), "tested": tested,
            "form": form or AlertRulesForm(initial=AlertRulesForm.initial_from(config))}


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


@login_required
@require_POST
@role_required("alerts_configure")
def alerts_configure(request):
    form = AlertRulesForm(request.POST)
    if not form.is_valid():
        return render(request, "plugins_app/alerts.html", _context(form=form), status=400)
    data = form.cleaned_data
    try:
        alert_service.configure(actor(request), data["rules"], data["fallback_rate"], data["queue_lag"],
                                data["webhooks"])
    except (alert_service.config_service.ConfigWriteError, OSError) as exc:
        form.add_error(None, f"config.toml was not changed: {exc}")
        return render(request, "plugins_app/alerts.html", _context(form=form), status=400)
    messages.success(request, "Alert rules saved to config.toml; they apply from the next evaluation.")
    return redirect("alerts")
