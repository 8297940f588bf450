"""Tokens and audit (owners only): create and revoke API tokens, see who changed what."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.views.decorators.http import require_GET, require_POST

from plugins_app.forms import TokenForm
from plugins_app.models import ApiToken
from plugins_app.selectors import dashboard
from plugins_app.services import tokens as token_service
from plugins_app.views.plugins import actor, role_required


def _page(request, form=None, created=None, error=None, revoked=None, status=200):
    return render(request, "plugins_app/tokens.html", {
        "form": form or TokenForm(), "created": created, "error": error, "revoked": revoked,
        "tokens": dashboard.tokens(), "audit": dashboard.audit(100),
    }, status=status)


@login_required
@require_GET
@role_required("owner")
def tokens_page(request):
    return _page(request)


@login_required
@require_POST
@role_required("owner")
def token_create(request):
    form = TokenForm(request.POST)
    if not form.is_valid():
        return _page(request, form=form, status=400)
    try:
        token, raw = token_service.create_token(form.cleaned_data["name"], form.cleaned_data["role"],
                                                created_by=request.user, actor=actor(request))
    except ValueError as exc:
        return _page(request, form=form, error=str(exc), status=400)
    return _page(request, created={"token": token, "raw": raw})


@login_required
@require_POST
@role_required("owner")
def token_revoke(request, token_id: int):
    try:
        token = token_service.revoke_token(token_id, actor=actor(request))
    except ApiToken.DoesNotExist:
        return _page(request, error=f"There is no token #{token_id}.", status=404)
    return _page(request, revoked=token)
