"""`[context_engine]`, `[llm]`, `[limits]`, `[plugin_env]` and `[embeddings]` (engine/embeddings.py) from
$LIBREFANG_HOME/config.toml, re-read whenever the file changes on disk."""

from __future__ import annotations

import tomllib
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from engine.embeddings import EmbeddingsConfig
from engine.filecache import FileCache


class LlmConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")
    base_url: str | None = None
    model: str | None = None
    api_key_env: str | None = "LIBREFANG_LLM_API_KEY"
    timeout_secs: float = 30.0


class ContextEngineConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")

    plugin: str | None = None
    plugin_stack: list[str] = Field(default_factory=list)
    plugin_stack_weights: dict[str, float] = Field(default_factory=dict)
    stable_prefix_mode: bool = False
    max_recall_results: int = 5
    context_window_tokens: int = 200_000
    allowed_env_vars: list[str] = Field(default_factory=list)
    after_turn_max_chars: int | None = None

    @property
    def chain(self) -> list[str]:
        """Plugins in order. A stack wins over `plugin`; a one-entry stack is accepted too (LibreFang ignores it)."""
        if self.plugin_stack:
            return list(dict.fromkeys(self.plugin_stack))
        return [self.plugin] if self.plugin else []

    @property
    def mode(self) -> str:
        return "stacked" if len(self.chain) > 1 else "single" if self.chain else "default"


class Limits(BaseModel):
    """`[limits]`: the operator's ceilings. No manifest and no approval takes a hook above them
    (engine/plugins/permissions.py; docs/security.md, "Permissions and approvals")."""

    model_config = ConfigDict(extra="forbid")
    max_processes: int = Field(256, gt=0)
    max_memory_mb: int = Field(2048, gt=0)
    hook_timeout_secs: float = Field(120.0, gt=0)
    max_disk_mb: int = Field(1024, gt=0)  # the hook's writable space (its data directory, /tmp, /dev/shm)
    max_cpu_secs: int | None = Field(None, gt=0)  # unset: a hook's CPU is bounded by its timeout


class PluginEnv(BaseModel):
    """`[plugin_env]`: the service variables a plugin may ask for (its `[env]` "${VAR}" values and its
    `allowed_env_vars`). The service's own are never handed over, listed or not (engine/plugins/permissions.py)."""

    model_config = ConfigDict(extra="forbid")
    allow: list[str] = Field(default_factory=list)


class SandboxConfig(BaseModel):
    """`[sandbox]`: the host identities hooks run as when the service is root (engine/process/identity.py). A plugin's
    hooks get uid = gid = uid_base + a stable slot of its name among uid_count; `uid_count = 1` gives every plugin
    uid_base (e.g. 65534, nobody). The range must be free on the host (no user, no other service uses it)."""

    model_config = ConfigDict(extra="ignore")
    uid_base: int = Field(default=1_800_000_000, ge=1, le=4_294_967_294)
    uid_count: int = Field(default=10_000_000, ge=1)

    @model_validator(mode="after")
    def _in_range(self) -> SandboxConfig:
        if self.uid_base + self.uid_count - 1 > 4_294_967_294:
            raise ValueError("[sandbox] uid_base + uid_count - 1 must stay below 4294967295")
        return self


class ServiceConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")
    context_engine: ContextEngineConfig = Field(default_factory=ContextEngineConfig)
    llm: LlmConfig = Field(default_factory=LlmConfig)
    limits: Limits = Field(default_factory=Limits)
    plugin_env: PluginEnv = Field(default_factory=PluginEnv)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    embeddings: EmbeddingsConfig = Field(default_factory=EmbeddingsConfig)
    error: str | None = None


def parse_service_config(text: str) -> ServiceConfig:
    return ServiceConfig.model_validate(tomllib.loads(text))


class ConfigCache(FileCache[ServiceConfig]):
    """config.toml, parsed once per change. A broken file keeps the last good config, with `error` set on it."""

    def __init__(self, path: Path):
        super().__init__(path, parse_service_config, ServiceConfig(), "configuration")

    def get(self) -> ServiceConfig:
        value = super().get()
        value.error = self.error
        return value
