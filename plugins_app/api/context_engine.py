"""Context-engine routes: the agent hook calls and metrics. Over daphne, a hook call Django would hand to its route
as it is (POST to a known hook, a Host it accepts, no cookies, a body within the limit) is answered before Django by
plugins_app/api/hook_asgi.py, refusals included; the routes here describe every hook call (OpenAPI) and answer the
others. Both parse and check a call with `agent_call`."""

from django.http import HttpRequest, HttpResponse
from ninja import Path, Query, Schema
from pydantic import Field

from engine import hook_requests
from engine.errors import validation_details
from engine.hook_replies import HOOK_REPLY_MODELS
from engine.hooks import ALL_HOOKS
from plugins_app.api.contract import body_of
from plugins_app.api.errors import ApiError, json_body, json_response, parse_json_object
from plugins_app.api.security import ActionRouter, CachedHookAuth, actor
from plugins_app.auth import check_agents
from plugins_app.schemas import (
    ChainOut,
    EngineConfigIn,
    EngineConfigOut,
    EngineHealthOut,
    ErrorEnvelope,
    MetricsOut,
    MetricsSummaryOut,
    ResetOut,
    TraceListOut,
    TraceOut,
)
from plugins_app.selectors import config as config_selectors
from plugins_app.selectors import doctor as doctor_selectors
from plugins_app.selectors import metrics_export
from plugins_app.selectors import traces as trace_selectors
from plugins_app.selectors.metrics import metrics_by_plugin
from plugins_app.services import hooks as hook_service
from plugins_app.services import metrics as metrics_service
from plugins_app.services import plugins as plugin_service

router = ActionRouter(tags=["context-engine"])
# The agents' hook calls: one action, with the token looked up through the per-process cache.
HOOKS_ACTION = "hooks_call"
hooks = ActionRouter(tags=["context-engine"], action=HOOKS_ACTION, auth_class=CachedHookAuth)


def optional_body_openapi(schema: type[Schema]) -> dict:
    return {"requestBody": {"required": False, "content": {"application/json": {"schema": schema.model_json_schema()}}}}


def agent_call(hook: str, token, body: bytes) -> hook_requests.AgentRequest:
    """A hook call of the admitted `token`, parsed and checked once, on whichever path it came (this route or
    plugins_app/api/hook_asgi.py): the body (413, 400 invalid_json), its shape against the hook's model (400
    validation_error; engine/hook_requests.py `accept`, in any dialect), the agents a bound token may name (403).
    Raises ApiError."""
    call = validated(hook, parse_json_object(body))
    check_agents(token, hook_requests.agent_ids(hook, call.request))
    return call


def validated(hook: str, data: dict) -> hook_requests.AgentRequest:
    """The hook's request checked against its model (in any dialect); 400 validation_error otherwise."""
    try:
        return hook_requests.accept(hook, data)
    except hook_requests.ValidationError as exc:
        raise ApiError(400, "validation_error", f"invalid {hook} request", validation_details(exc.errors())) from exc


def answer_response(answer: hook_service.Answer) -> HttpResponse:
    response = HttpResponse(answer.body, status=answer.status, content_type="application/json")
    for name, value in answer.headers.items():
        response[name] = value
    return response


RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before sending the call again",
                               "schema": {"type": "integer", "minimum": 1}}}


def _make_hook_route(hook: str):
    schema = hook_requests.HOOK_REQUEST_MODELS[hook]
    fire_and_forget = hook in ("after_turn", "on_event")
    reply = HOOK_REPLY_MODELS[hook]
    responses = {202: reply} if fire_and_forget else {200: reply}
    responses.update({400: ErrorEnvelope, 401: ErrorEnvelope, 403: ErrorEnvelope, 413: ErrorEnvelope,
                      502: ErrorEnvelope})
    extra = body_of(schema)
    if fire_and_forget:  # not stored because Redis is unreachable (Retry-After says when to send it again)
        responses[503] = ErrorEnvelope
        extra["responses"] = {"503": {"description": "not stored: the job bus is unreachable", "headers": RETRY_AFTER}}

    async def call(request: HttpRequest):
        # The schema is declared for OpenAPI only: ninja does not parse the body, agent_call does, once.
        return answer_response(await hook_service.answer(agent_call(hook, request.auth, request.body)))

    call.__name__ = f"hook_{hook}"
    call.__doc__ = (f"Agent call for the `{hook}` hook. " + (
        "Answered 202 once the job is stored; processed at least once by a worker. 503 with Retry-After when the "
        "job bus is unreachable (nothing stored: send it again)." if fire_and_forget else
        "The final result after stack and fallback, with `source` and `fallback_reason`."))
    hooks.add_api_operation(f"/hooks/{hook}", ["POST"], call, response=responses, operation_id=f"hook_{hook}",
                            openapi_extra=extra)


for _hook in ALL_HOOKS:
    _make_hook_route(_hook)


@hooks.post("/hooks/{hook}", response={404: ErrorEnvelope, 401: ErrorEnvelope}, operation_id="hook_unknown",
            include_in_schema=False)
def unknown_hook(request, hook: str):
    raise ApiError(404, "unknown_hook", f"unknown hook {hook!r}", {"hooks": list(ALL_HOOKS)})


@router.get("/metrics", response={200: MetricsOut, 401: ErrorEnvelope, 403: ErrorEnvelope}, operation_id="metrics_get")
def metrics(request):
    """Per plugin, per hook: calls, successes, failures, latency_ms_total (+ p50/p95/p99, last error)."""
    return json_response(metrics_by_plugin())


# ---- metrics, traces, chain, config, health ----

E = {400: ErrorEnvelope, 401: ErrorEnvelope, 403: ErrorEnvelope, 404: ErrorEnvelope, 409: ErrorEnvelope,
     413: ErrorEnvelope}


@router.get("/metrics/summary", response={200: MetricsSummaryOut, **E},
            operation_id="metrics_summary")
def metrics_summary(request):
    """Per hook (summed over plugins) and totals: calls, successes, failures, total_ms, avg_ms, error_rate_pct."""
    return json_response(metrics_export.summary())


@router.get("/metrics/prometheus", response={200: str, **E}, operation_id="metrics_prometheus",
            openapi_extra={"responses": {"200": {"description": "Prometheus text format 0.0.4",
                                                 "content": {"text/plain": {"schema": {"type": "string"}}}}}})
def metrics_prometheus(request):
    return HttpResponse(metrics_export.prometheus(), content_type="text/plain; version=0.0.4; charset=utf-8")


class ResetIn(Schema):
    plugin: str | None = Field(None, max_length=128)


@router.post("/metrics/reset", response={200: ResetOut, **E}, operation_id="metrics_reset",
             openapi_extra=optional_body_openapi(ResetIn))
def metrics_reset(request):
    """Zero the persisted counters (all plugins, or one with {"plugin": name}). Traces are kept."""
    body = json_body(request, ResetIn)
    return json_response(metrics_service.reset_metrics(actor(request), body.plugin))


class TraceFilters(Schema):
    plugin: str | None = Field(None, max_length=128)
    hook: str | None = Field(None, max_length=40)
    agent: str | None = Field(None, max_length=200)
    failures_only: bool = False
    limit: int = Field(50, ge=1, le=500)


@router.get("/traces", response={200: TraceListOut, **E}, operation_id="traces_list")
def traces(request, filters: Query[TraceFilters]):
    """Newest first, filtered by plugin, hook, agent and failures only."""
    items = trace_selectors.list_traces(filters.plugin, filters.hook, filters.agent, filters.failures_only,
                                        filters.limit)
    return json_response({"traces": items, "count": len(items), "limit": filters.limit,
                          "filters": filters.model_dump(exclude={"limit"})})


@router.get("/traces/history", response={200: TraceListOut, **E}, operation_id="traces_history")
def traces_history(request, filters: Query[TraceFilters]):
    """LibreFang's history shape: the same filtered list (from the database) with `total`, `limit` and `source`."""
    items = trace_selectors.list_traces(filters.plugin, filters.hook, filters.agent, filters.failures_only,
                                        filters.limit)
    return json_response({"traces": items, "count": len(items), "total": len(items), "limit": filters.limit,
                          "source": "database", "filters": filters.model_dump(exclude={"limit"})})


@router.get("/traces/{trace_id}", response={200: TraceOut, **E}, operation_id="traces_get")
def trace(request, trace_id: str = Path(..., pattern="^[0-9a-f]{16}$", description="16 lowercase hex characters")):
    try:
        found = trace_selectors.get_trace(trace_id)
    except ValueError as exc:
        raise ApiError(400, "invalid_trace_id", str(exc)) from exc
    if found is None:
        raise ApiError(404, "not_found", f"no trace {trace_id}")
    return json_response(found)


@router.get("/chain", response={200: ChainOut, **E}, operation_id="engine_chain")
def chain(request):
    """The configured plugin or stack, layer by layer; the default engine is the fallback."""
    return json_response(config_selectors.chain())


@router.get("/config", response={200: EngineConfigOut, **E}, operation_id="engine_config_get")
def get_config(request):
    return json_response(config_selectors.engine_config())


@router.put("/config", response={200: EngineConfigOut, **E}, operation_id="engine_config_put")
def put_config(request, body: EngineConfigIn):
    """`{"plugin": name}` or `{"plugin_stack": [a, b]}` (both null or empty: the default engine). Written to
    config.toml atomically; comments and other settings are preserved."""
    return json_response(plugin_service.set_engine_config(body.plugin, body.plugin_stack, actor(request)))


@router.get("/health", response={200: EngineHealthOut, **E}, operation_id="engine_health",
            openapi_extra={"responses": {"503": {"description": "an active plugin has lint errors or is missing"}}})
def engine_health(request):
    """Lints every active plugin: 200 healthy, 503 with the issues otherwise."""
    cfg = config_selectors.engine_config()
    issues = []
    for name in cfg["chain"]:
        try:
            report = doctor_selectors.lint(name)
        except KeyError:
            issues.append({"plugin": name, "errors": [{"id": "plugin.missing", "message": "not installed"}]})
            continue
        if not report["ok"]:
            issues.append({"plugin": name, "errors": report["errors"]})
    body = {"healthy": not issues, "mode": cfg["mode"], "active_plugins": cfg["serving"], "issues": issues}
    return json_response(body, 200 if not issues else 503)
