"""Request and response schemas of the HTTP API (pydantic, via django-ninja). Hook requests: engine/hook_requests.py."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal, get_type_hints

from ninja import Schema
from pydantic import ConfigDict, Field, create_model, model_validator

from plugins_app.selectors.plugins import PluginSummary


class ErrorBody(Schema):
    code: str
    message: str
    details: Any | None = None


class ErrorEnvelope(Schema):
    error: ErrorBody


class HookReply(Schema):
    """The final result after stack and fallback: the hook's result fields plus where it came from."""

    model_config = ConfigDict(extra="allow")
    type: str
    source: str
    fallback_reason: str | None = None


class Accepted(Schema):
    accepted: bool
    job_id: str
    hook: str


class HookMetricOut(Schema):
    model_config = ConfigDict(extra="allow")
    calls: int
    successes: int
    failures: int
    latency_ms_total: float


class MetricsOut(Schema):
    plugins: dict[str, dict[str, HookMetricOut]]


class HealthOut(Schema):
    model_config = ConfigDict(extra="allow")
    status: Literal["ok", "degraded"]
    web: bool
    redis: bool
    database: bool
    workers: list[dict[str, Any]]


# ---- plugin management ----

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"
HookName = Literal["ingest", "after_turn", "assemble", "compact", "bootstrap", "prepare_subagent", "merge_subagent",
                   "transform_tool_result", "on_event"]


class ScaffoldIn(Schema):
    name: str = Field(min_length=1, max_length=128, pattern=NAME_PATTERN)
    description: str = Field("", max_length=500)
    runtime: str = Field("python", max_length=32)
    hooks: list[HookName] | None = None


class InstallIn(Schema):
    """`{"source":"local","path"}` | `{"source":"git","url","ref"?|"branch"?}` |
    `{"source":"registry","name","registry"?|"github_repo"?}`"""

    source: Literal["local", "git", "registry"]
    path: str | None = Field(None, max_length=4096)
    url: str | None = Field(None, max_length=4096)
    ref: str | None = Field(None, max_length=256)
    branch: str | None = Field(None, max_length=256)
    name: str | None = Field(None, max_length=128)
    registry: str | None = Field(None, max_length=4096)
    github_repo: str | None = Field(None, max_length=256)


class NameIn(Schema):
    name: str = Field(min_length=1, max_length=128, pattern=NAME_PATTERN)


class UpdateIn(Schema):
    force: bool = False


class TestHookIn(Schema):
    hook: HookName
    input: dict[str, Any] = Field(default_factory=dict)


class EngineConfigIn(Schema):
    """`plugin` or `plugin_stack`; the default engine must be asked for (`{"plugin": null}` or
    `{"plugin_stack": []}`): an empty or non-object body is a mistake, not a switch."""

    plugin: str | None = Field(None, max_length=128, pattern=NAME_PATTERN)
    plugin_stack: list[Annotated[str, Field(pattern=NAME_PATTERN)]] | None = Field(None, max_length=32)

    @model_validator(mode="after")
    def _names_the_engine(self) -> EngineConfigIn:
        # ({} and [] both arrive here with no field set)
        if not self.model_fields_set & {"plugin", "plugin_stack"}:
            raise ValueError('the body must be a JSON object giving `plugin` or `plugin_stack` ({"plugin": null} '
                             "selects the default engine)")
        return self


class Open(Schema):
    """An object with the listed fields and possibly more."""

    model_config = ConfigDict(extra="allow")


def _schema_of(dataclass_type: type, name: str) -> type[Open]:
    """An Open response schema with the fields (types, defaults) of a selector's dataclass: written once there."""
    hints = get_type_hints(dataclass_type)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(dataclass_type):
        if f.default is not dataclasses.MISSING:
            fields[f.name] = (hints[f.name], f.default)
        elif f.default_factory is not dataclasses.MISSING:
            fields[f.name] = (hints[f.name], Field(default_factory=f.default_factory))
        else:
            fields[f.name] = (hints[f.name], ...)
    return create_model(name, __base__=Open, **fields)


# A plugin as GET /plugins lists it: plugins_app/selectors/plugins.py PluginSummary.to_dict().
PluginOut = _schema_of(PluginSummary, "PluginOut")


class PluginListOut(Schema):
    items: list[PluginOut]
    total: int
    offset: int
    limit: int | None


class ScaffoldOut(Open):
    scaffolded: bool
    name: str
    path: str
    plugin: PluginOut


class ReloadOut(Open):
    status: str
    name: str
    version: str
    hooks_valid: bool


class EnabledOut(Open):
    name: str
    enabled: bool
    changed: bool
    message: str


class InstallOut(Open):
    installed: bool
    name: str
    version: str
    path: str


class UninstallOut(Open):
    removed: bool
    name: str


class UpdateOut(Open):
    updated: bool
    name: str
    version: str


class LintOut(Schema):
    plugin: str
    ok: bool
    errors: list[dict[str, Any]]
    warnings: list[dict[str, Any]]


class DoctorOut(Open):
    runtimes: list[dict[str, Any]]
    plugins: list[dict[str, Any]]


class TestHookOut(Open):
    ok: bool
    success: bool
    plugin: str
    hook: str
    reply: Any = None
    error: dict[str, Any] | None = None
    stderr: str
    elapsed_ms: float | None = None
    trace_id: str | None = None


class TraceOut(Open):
    trace_id: str
    plugin: str
    hook: str
    success: bool
    elapsed_ms: float


class TraceListOut(Open):
    traces: list[TraceOut]
    count: int
    filters: dict[str, Any]


class ChainOut(Open):
    mode: str
    chain: list[dict[str, Any]]
    chain_length: int


class EngineConfigOut(Open):
    mode: str
    plugin: str | None
    plugin_stack: list[str]


class EngineHealthOut(Open):
    healthy: bool
    mode: str
    active_plugins: list[str]
    issues: list[dict[str, Any]]


class MetricsSummaryOut(Open):
    hooks: dict[str, dict[str, Any]]
    totals: dict[str, Any]


class ResetOut(Open):
    reset: bool


class PluginStatusOut(Open):
    name: str
    version: str
    hooks_valid: bool
    enabled: bool
    active: bool
    active_as_single: bool
    stack_position: int | None


class PluginHealthOut(Open):
    plugin: str
    status: Literal["loaded", "disabled"]
    active: bool
    hook_stats: dict[str, dict[str, Any]]
    recent_traces: list[dict[str, Any]]


# ---- memories (the default engine's memory store) ----

class MemoryIn(Schema):
    agent_id: str = Field(min_length=1, max_length=200)
    peer_id: str | None = Field(None, max_length=200)
    content: str = Field(min_length=1, max_length=20_000)
    tags: list[Annotated[str, Field(max_length=64)]] = Field(default_factory=list, max_length=16)


class MemoryOut(Open):
    id: int
    agent_id: str
    peer_id: str | None
    content: str
    scope: str
    tags: list[str]
    source: str
    created_at: str
    score: float | None = None


class MemoryListOut(Schema):
    items: list[MemoryOut]
    total: int
    offset: int
    limit: int
    query: str | None


class MemoryDeleteOut(Open):
    deleted: int
    agent_id: str
