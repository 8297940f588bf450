"""Schemas of LibreFang's further plugin and context-engine routes: install-with-deps, batch, benchmark, prewarm,
update-check, state, registries, env and advanced config, per-agent metrics, sandbox policy."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from ninja import Schema
from pydantic import ConfigDict, Field

from plugins_app.schemas import NAME_PATTERN, HookName, Open


class InstallWithDepsIn(Schema):
    name: str = Field(min_length=1, max_length=128, pattern=NAME_PATTERN)
    registry: str | None = Field(None, max_length=4096)
    github_repo: str | None = Field(None, max_length=256)
    ref: str | None = Field(None, max_length=256)


class InstallWithDepsOut(Open):
    name: str
    order: list[str]
    installed: list[str]
    already_installed: list[str]
    count: int
    message: str


class BatchIn(Schema):
    operation: Literal["enable", "disable", "reload"]
    plugins: list[Annotated[str, Field(max_length=128)]] = Field(min_length=1, max_length=100)


class BatchItemOut(Open):
    plugin: str
    ok: bool


class BatchOut(Open):
    operation: str
    results: list[BatchItemOut]
    all_ok: bool
    succeeded: int
    failed: int


class BenchmarkIn(Schema):
    hook: HookName | None = Field(None, description="one hook; default: every hook the plugin declares")
    input: dict[str, Any] | None = Field(None, description="the request for `hook`; default: a valid sample")
    runs: int = Field(5, ge=1, le=50)


class LatencyOut(Open):
    min: float | None
    max: float | None
    avg: float | None
    p50: float | None
    p95: float | None
    p99: float | None
    all: list[float]


class BenchmarkHookOut(Open):
    hook: str
    runs: int
    ok: int
    errors: int
    latency_ms: LatencyOut
    round_trip_ms: LatencyOut


class BenchmarkOut(Open):
    plugin: str
    runs: int
    hooks: list[BenchmarkHookOut]


class PrewarmPluginOut(Open):
    plugin: str
    runtime: str
    warmed: list[str]  # hooks whose zygote this worker confirmed running
    skipped: dict[str, str]  # hook -> why there is nothing to warm (another runtime, warm_start = false ...)
    failed: dict[str, str]  # hook -> why it could not be warmed
    zygotes: int
    bundle: str = ""  # the pinned bundle fetched (hash prefix), "" without pinning


class PrewarmWorkerOut(Open):
    worker: str
    host: str
    pid: int | None
    ok: bool
    error: str
    plugins: list[PrewarmPluginOut]
    zygote_pids: list[int]
    elapsed_ms: float | None


class PrewarmMissingOut(Open):
    worker: str
    host: str
    pid: int | None


class PrewarmIn(Schema):
    plugins: list[str] = Field(default_factory=list, max_length=1000,
                               description="the plugins to warm (LibreFang's body); empty or no body: every enabled one")


class PrewarmResultOut(Open):
    ok: bool
    message: str


class PrewarmOut(Open):
    plugins: list[str]
    workers: list[PrewarmWorkerOut]  # what each worker that answered confirmed
    missing: list[PrewarmMissingOut]  # workers that heartbeat but did not answer in time: nothing is claimed for them
    warmed_everywhere: bool
    results: dict[str, PrewarmResultOut]  # LibreFang's per-plugin answer: ok only when every live worker confirmed


class UpdateCheckOut(Open):
    plugin: str
    installed_version: str
    available_version: str
    update_available: bool


class PluginStateOut(Open):
    plugin: str
    path: str
    size_bytes: int
    file_count: int
    files: list[dict[str, Any]]


class StateWipeOut(Open):
    plugin: str
    wiped: bool
    files_removed: int
    bytes_freed: int


class RegistrySearchOut(Open):
    registry: str
    query: str
    results: list[dict[str, Any]]
    total: int
    signed: bool


class RegistriesOut(Open):
    registries: list[dict[str, Any]]
    total: int


class PluginEnvOut(Open):
    name: str
    env: dict[str, str]
    env_schema: dict[str, Any]
    enable_shared_state: bool


class EnvIn(Schema):
    env: dict[Annotated[str, Field(max_length=128)], Annotated[str, Field(max_length=8192)] | None] = Field(
        description="keys to set; null removes a key", max_length=200)


class AdvancedConfigOut(Open):
    name: str


class AdvancedConfigIn(Schema):
    """Only the settings given change; null removes a setting so its default applies."""

    model_config = ConfigDict(extra="forbid")
    hook_timeout_secs: float | None = None
    on_hook_failure: Literal["warn", "skip", "abort"] | None = None
    max_retries: int | None = None
    retry_delay_ms: int | None = None
    ingest_filter: str | None = None
    ingest_regex: str | None = None
    only_for_agent_ids: list[str] | None = None
    hook_cache_ttl_secs: float | None = None
    assemble_cache_ttl_secs: float | None = None
    compact_cache_ttl_secs: float | None = None
    persistent_subprocess: bool | None = None
    prewarm_subprocesses: bool | None = None
    warm_start: bool | None = None
    after_turn_queue_depth: int | None = None
    after_turn_max_chars: int | None = None
    allow_network: bool | None = None
    allow_filesystem: bool | None = None
    max_memory_mb: int | None = None
    max_cpu_secs: int | None = None
    circuit_breaker: dict[str, int] | None = None
    priority: int | None = None
    enable_shared_state: bool | None = None
    otel_endpoint: str | None = None


class PerAgentMetricsOut(Open):
    per_agent: dict[str, dict[str, Any]]
    total_agents: int


class SandboxPolicyOut(Open):
    mode: str
    plugins: list[dict[str, Any]]
    global_defaults: dict[str, Any]
