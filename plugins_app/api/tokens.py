"""API tokens over the API (owners only), as `librefang token create|list|revoke` and the dashboard's Tokens page:
create (the token is in the answer once, never again), list, revoke. An agent token may be bound to agent ids."""

from __future__ import annotations

from ninja import Path

from plugins_app.api.contract import body_of
from plugins_app.api.errors import ApiError, json_body, json_response
from plugins_app.api.security import ActionRouter, actor
from plugins_app.models import ApiToken
from plugins_app.schemas import ErrorEnvelope, TokenCreatedOut, TokenIn, TokenListOut, TokenOut
from plugins_app.services import tokens as token_service

router = ActionRouter(tags=["tokens"], action="tokens_manage")
E = {400: ErrorEnvelope, 401: ErrorEnvelope, 403: ErrorEnvelope, 404: ErrorEnvelope}


@router.get("", response={200: TokenListOut, **E}, operation_id="tokens_list")
def list_tokens(request, include_revoked: bool = False):
    """Every token (never the secret itself), newest first; `agent_ids` is `[]` for an agent token that may act
    for every agent, null for other roles."""
    qs = ApiToken.objects.all() if include_revoked else ApiToken.objects.filter(revoked_at__isnull=True)
    return json_response({"items": [token_service.describe(t) for t in qs[:1000]]})


@router.post("", response={201: TokenCreatedOut, **E}, operation_id="tokens_create",
             openapi_extra=body_of(TokenIn))
def create(request):
    """A new token; `token` is the secret, shown in this answer only."""
    body = json_body(request, TokenIn)
    try:
        token, raw = token_service.create_token(body.name, body.role, actor=actor(request), agent_ids=body.agent_ids)
    except ValueError as exc:
        raise ApiError(400, "validation_error", str(exc)) from exc
    return json_response({**token_service.describe(token), "token": raw}, 201)


@router.post("/{token_id}/revoke", response={200: TokenOut, **E}, operation_id="tokens_revoke")
def revoke(request, token_id: int = Path(..., ge=1, le=2**63 - 1)):
    """Requests with the token get 401 from now on (within the few seconds a web process caches a token)."""
    try:
        token = token_service.revoke_token(token_id, actor=actor(request))
    except ApiToken.DoesNotExist as exc:
        raise ApiError(404, "not_found", f"there is no token #{token_id}") from exc
    return json_response(token_service.describe(token))
