"""Context-engine routes: the agent hook calls and metrics."""


import json

from django.http import HttpRequest
from ninja import Router
from pydantic import ValidationError as PydanticValidationError

from engine.hooks import ALL_HOOKS
from plugins_app.api.errors import ApiError, json_response
from plugins_app.api.security import AGENT, VIEWER
from plugins_app.schemas import HOOK_REQUEST_SCHEMAS, Accepted, ErrorEnvelope, HookReply, MetricsOut
from plugins_app.selectors.metrics import metrics_by_plugin
from plugins_app.services import hooks as hook_service

router = Router(tags=["context-engine"])


def parse_body(request: HttpRequest) -> dict:
    from django.conf import settings

    if len(request.body) > settings.LIBREFANG_MAX_BODY_BYTES:
        raise ApiError(413, "payload_too_large", f"request body exceeds {settings.LIBREFANG_MAX_BODY_BYTES} bytes")
    try:
        data = json.loads(request.body or b"null")
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, "invalid_json", f"The request body is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ApiError(400, "invalid_json", "The request body must be a JSON object.")
    return data


def validated(hook: str, data: dict) -> dict:
    schema = HOOK_REQUEST_SCHEMAS[hook]
    try:
        schema.model_validate(data)
    except PydanticValidationError as exc:
        details = [{"loc": [str(p) for p in e["loc"]], "msg": e["msg"], "type": e["type"]} for e in exc.errors()]
        raise ApiError(400, "validation_error", f"invalid {hook} request", details) from exc
    return data


def _make_hook_route(hook: str):
    schema = HOOK_REQUEST_SCHEMAS[hook]
    fire_and_forget = hook in ("after_turn", "on_event")
    responses = {202: Accepted} if fire_and_forget else {200: HookReply}
    responses.update({400: ErrorEnvelope, 401: ErrorEnvelope, 403: ErrorEnvelope, 413: ErrorEnvelope})

    async def call(request: HttpRequest, body: schema):  # type: ignore[valid-type]
        data = validated(hook, parse_body(request))
        status, reply = await hook_service.call_hook(hook, data)
        return json_response(reply, status)

    call.__name__ = f"hook_{hook}"
    call.__doc__ = (f"Agent call for the `{hook}` hook. " + (
        "Answered 202 at once; processed at least once by a worker." if fire_and_forget else
        "The final result after stack and fallback, with `source` and `fallback_reason`."))
    router.add_api_operation(f"/hooks/{hook}", ["POST"], call, auth=AGENT, response=responses,
                             operation_id=f"hook_{hook}")


for _hook in ALL_HOOKS:
    _make_hook_route(_hook)


@router.post("/hooks/{hook}", auth=AGENT, response={404: ErrorEnvelope, 401: ErrorEnvelope},
             operation_id="hook_unknown", include_in_schema=False)
def unknown_hook(request, hook: str):
    raise ApiError(404, "unknown_hook", f"unknown hook {hook!r}", {"hooks": list(ALL_HOOKS)})


@router.get("/metrics", auth=VIEWER, response={200: MetricsOut, 401: ErrorEnvelope, 403: ErrorEnvelope})
def metrics(request):
    """Per plugin, per hook: calls, successes, failures, latency_ms_total (+ p50/p95/p99, last error)."""
    return json_response(metrics_by_plugin())
