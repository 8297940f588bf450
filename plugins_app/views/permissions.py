"""The Approve button of the plugin page's Permissions card (plugins_app/templatetags/permission_tags.py renders the
card): an owner approves the plugin.toml version the card showed."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from plugins_app.selectors import permissions as perm_selectors
from plugins_app.selectors import plugins as plugin_selectors
from plugins_app.services import permissions as perm_service
from plugins_app.services.plugins import PluginError
from plugins_app.views.roles import actor, role_required


@login_required
@require_POST
@role_required("plugins_approve")
def plugin_approve(request, name: str):
    if not plugin_selectors.is_installed(name):
        raise Http404(f"no plugin named {name}")
    try:
        perm_service.approve(name, actor(request), expected_sha256=request.POST.get("manifest_sha256") or None)
        ok, message = True, "Approved: from the next call its hooks get what this version asks, within the ceilings."
    except PluginError as exc:
        ok, message = False, exc.message
    if not request.htmx:
        return redirect("plugin_detail", name=name)
    return render(request, "plugins_app/partials/permissions.html",
                  {"perm": perm_selectors.permissions(name), "ok": ok, "message": message})
