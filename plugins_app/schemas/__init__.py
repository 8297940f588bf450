"""Request and response schemas of the HTTP API (pydantic, via django-ninja). Hook requests: engine/hook_requests.py."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Annotated, Any, Literal, get_type_hints

from ninja import Schema
from pydantic import AfterValidator, ConfigDict, Field, create_model, model_validator

from plugins_app.selectors.plugins import PluginSummary


class ErrorBody(Schema):
    code: str
    message: str
    details: Any | None = None


class ErrorEnvelope(Schema):
    error: ErrorBody


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

def _small_json(value: dict[str, Any]) -> dict[str, Any]:
    import json

    if len(json.dumps(value, default=str)) > MAX_METADATA_BYTES:
        raise ValueError(f"metadata is larger than {MAX_METADATA_BYTES} bytes as JSON")
    return value


MAX_METADATA_BYTES = 16_384
Tag = Annotated[str, Field(min_length=1, max_length=64)]
Tags = list[Tag]
Metadata = Annotated[dict[Annotated[str, Field(max_length=64)], Any], AfterValidator(_small_json)]
ScopeId = Annotated[str, Field(min_length=1, max_length=200)]
MemoryKey = Annotated[str, Field(min_length=1, max_length=200, description="unique within the memory's scope "
                                                                           "(agent, peer, session)")]
MemoryContent = Annotated[str, Field(min_length=1, max_length=20_000)]


class MemoryIn(Schema):
    """A new memory. Its scope is the agent, and the peer and session when given."""

    model_config = ConfigDict(extra="forbid")
    agent_id: ScopeId
    peer_id: ScopeId | None = None
    session_id: ScopeId | None = None
    key: MemoryKey | None = None
    content: MemoryContent
    tags: Tags = Field(default_factory=list, max_length=16)
    metadata: Metadata = Field(default_factory=dict, description="any JSON object; list filters match its "
                                                                 "top-level keys")
    expires_at: datetime | None = Field(None, description="after this the memory is never recalled nor listed")


class MemoryPutIn(MemoryIn):
    """Put by key: replaces the memory with this key in this scope, or makes it."""

    key: MemoryKey


class MemoryPatchIn(Schema):
    """The fields given replace the memory's (`metadata` and `tags` whole)."""

    model_config = ConfigDict(extra="forbid")
    content: MemoryContent | None = None
    tags: Tags | None = Field(None, max_length=16)
    metadata: Metadata | None = None
    expires_at: datetime | None = None


class MemoryOut(Schema):
    id: int
    agent_id: str
    peer_id: str | None
    session_id: str | None
    key: str | None
    content: str
    scope: str
    tags: list[str]
    metadata: dict[str, Any]
    source: str
    created_at: str
    updated_at: str
    expires_at: str | None
    score: float | None = Field(None, description="with a search: relevance, 0..1")
    scores: dict[str, float | None] | None = Field(
        None, description="with a search: vector (cosine), text (full-text) and fused (reciprocal rank fusion) scores, "
                          "each 0..1; null where that ranking did not find the memory")


class MemoryListOut(Schema):
    items: list[MemoryOut]
    total: int
    offset: int
    limit: int
    query: str | None
    next_cursor: str | None = Field(description="pass as `cursor` for the next page; null on the last")
    recall: dict[str, str | None] | None = Field(
        None, description="with a search: mode (hybrid, or text when vectors were unavailable) and fallback (why)")


class MemoryDeleteOut(Schema):
    deleted: int
    agent_id: str
    id: int | None = None
    peer_id: str | None = None
    session_id: str | None = None


class MemoryScopeOut(Schema):
    peer_id: str | None
    session_id: str | None
    count: int


class MemoryScopesOut(Schema):
    agent_id: str
    scopes: list[MemoryScopeOut]


# ---- tokens ----

class TokenIn(Schema):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=100)
    role: Literal["owner", "admin", "viewer", "agent"]
    agent_ids: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(
        default_factory=list, max_length=64,
        description="agent tokens only: the agent ids it may act for, a trailing * for a prefix; empty: every agent")


class TokenOut(Schema):
    id: int
    name: str
    role: str
    prefix: str
    agent_ids: list[str] | None = Field(description="[] for an agent token of every agent; null for other roles")
    active: bool
    created_at: str
    last_used_at: str | None
    revoked_at: str | None


class TokenCreatedOut(TokenOut):
    token: str = Field(description="the secret, shown in this answer only")


class TokenListOut(Schema):
    items: list[TokenOut]


# ---- WASM tools ----

class ToolExecuteIn(Schema):
    input: str | dict[str, Any] = Field(description="the tool-call argument string (any other JSON value is passed "
                                                    "as its JSON text)")


class ToolRunOut(Open):
    """A tool run: `ok` false with `error` (and `kind`) when the module failed or no worker ran it."""

    ok: bool
    output: str
    error: str | None = None
    kind: str | None = None
