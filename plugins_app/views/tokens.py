"""Tokens and audit (owners only): create and revoke API tokens, see who changed what.

Creating and revoking answer with a redirect (post/redirect/get), so refreshing the page never creates a second
token. A new token's secret is kept in the session for exactly one page view, then forgotten.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from plugins_app.forms import TokenForm
from plugins_app.models import ApiToken
from plugins_app.selectors import audit as audit_selectors
from plugins_app.selectors import dashboard
from plugins_app.services import tokens as token_service
from plugins_app.views.plugins import actor, role_required

NEW_TOKEN_KEY = "tokens.new"


def _page(request, form=None, created=None, error=None, status=200):
    return render(request, "plugins_app/tokens.html", {
        "form": form or TokenForm(), "created": created, "error": error,
        "tokens": dashboard.tokens(), "audit_log": audit_selectors.audit_log(request.GET),
    }, status=status)


@login_required
@require_GET
@role_required("tokens_manage")
def tokens_page(request):
    created = None
    shown = request.session.pop(NEW_TOKEN_KEY, None)  # one view only: a refresh no longer shows the secret
    if shown:
        token = dashboard.live_token(shown.get("id"))
        if token is not None:
            created = {"token": token, "raw": shown.get("raw", "")}
    return _page(request, created=created)


@login_required
@require_POST
@role_required("tokens_manage")
def token_create(request):
    form = TokenForm(request.POST)
    if not form.is_valid():
        return _page(request, form=form, status=400)
    try:
        token, raw = token_service.create_token(form.cleaned_data["name"], form.cleaned_data["role"],
                                                created_by=request.user, actor=actor(request),
                                                agent_ids=form.cleaned_data["agents"])
    except ValueError as exc:
        return _page(request, form=form, error=str(exc), status=400)
    request.session[NEW_TOKEN_KEY] = {"id": token.pk, "raw": raw}
    return redirect("tokens")


@login_required
@require_POST
@role_required("tokens_manage")
def token_revoke(request, token_id: int):
    try:
        token = token_service.revoke_token(token_id, actor=actor(request))
    except ApiToken.DoesNotExist:
        return _page(request, error=f"There is no token #{token_id}.", status=404)
    messages.success(request, f"Token “{token.name}” is revoked; requests using it now get 401.")
    return redirect("tokens")
