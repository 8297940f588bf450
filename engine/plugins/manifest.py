"""`plugin.toml`: parsed with pydantic, accepting both LibreFang's docs and its real code.

Execution keys are read from `[hooks]` and from the top level (the docs and the official mempalace plugin put them
there); `[context_engine_hooks]` is an alias of `[hooks]`; `[hooks]` wins on conflict. Unknown keys become findings.
"""

from __future__ import annotations

import os
import re
import tomllib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from engine import findings as F
from engine.findings import Finding
from engine.hooks import ALL_HOOKS, DEFAULT_TIMEOUT_SECS
from engine.process.runtimes import RUNTIMES, ResolvedRuntime, resolve_tag

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")
# The LibreFang release whose plugin protocol this engine implements; `librefang_min_version` is compared to it.
COMPAT_VERSION = "2026.8.23"
HOOK_PROTOCOL_VERSION = 1
KNOWN_NEEDS = frozenset({"network", "filesystem", "env", "subprocess", "gpu"})


class CircuitBreaker(BaseModel):
    max_failures: int = 5
    reset_secs: int = 60


class HookSettings(BaseModel):
    """`[hooks]`: hook script paths plus execution settings."""

    model_config = ConfigDict(extra="forbid")

    ingest: str | None = None
    after_turn: str | None = None
    assemble: str | None = None
    compact: str | None = None
    bootstrap: str | None = None
    prepare_subagent: str | None = None
    merge_subagent: str | None = None
    transform_tool_result: str | None = None
    on_event: str | None = None

    runtime: str | None = None
    hook_timeout_secs: float = Field(DEFAULT_TIMEOUT_SECS, gt=0, le=3600)
    on_hook_failure: Literal["warn", "skip", "abort"] = "warn"
    max_retries: int = Field(0, ge=0, le=10)
    retry_delay_ms: int = Field(500, ge=0, le=60_000)
    ingest_filter: str | None = None
    ingest_regex: str | None = None
    only_for_agent_ids: list[str] = Field(default_factory=list)
    hook_protocol_version: int = 1
    hook_schemas: dict[str, Any] = Field(default_factory=dict)
    output_schema_strict: bool = False
    hook_cache_ttl_secs: float | None = None
    assemble_cache_ttl_secs: float | None = None
    compact_cache_ttl_secs: float | None = None
    persistent_subprocess: bool = False
    prewarm_subprocesses: bool = False
    warm_start: bool = True
    after_turn_queue_depth: int = 16
    after_turn_max_chars: int = Field(500, ge=0)
    allow_network: bool = False  # LibreFang's secure default (#5862); enforced with a network namespace
    allow_filesystem: bool = True
    max_memory_mb: int | None = Field(None, gt=0)
    max_cpu_secs: int | None = Field(None, gt=0)
    max_processes: int | None = Field(None, gt=0)  # ours: the hook's pids limit (engine/process/runner.py has the default)
    circuit_breaker: CircuitBreaker | None = None
    priority: int = 0
    env_schema: dict[str, Any] = Field(default_factory=dict)
    enable_shared_state: bool = False
    otel_endpoint: str | None = None
    allowed_secrets: list[str] = Field(default_factory=list)
    allowed_env_vars: list[str] = Field(default_factory=list)

    @field_validator("on_hook_failure", mode="before")
    @classmethod
    def _lower(cls, v: Any) -> Any:
        return v.strip().lower() if isinstance(v, str) else v

    def script_for(self, hook: str) -> str | None:
        return getattr(self, hook, None) if hook in ALL_HOOKS else None

    def declared_hooks(self) -> dict[str, str]:
        return {h: getattr(self, h) for h in ALL_HOOKS if getattr(self, h)}


HOOK_SETTING_KEYS = frozenset(HookSettings.model_fields) - frozenset(ALL_HOOKS)


class I18nEntry(BaseModel):
    name: str | None = None
    description: str | None = None


class ConfigField(BaseModel):
    type: Literal["string", "number", "boolean"] = "string"
    default: Any = None
    description: str | None = None


class Requirement(BaseModel):
    binary: str
    install_hint: str | None = None


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    version: str = ""
    description: str = ""
    author: str = ""
    hooks: HookSettings = Field(default_factory=HookSettings)
    requirements: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    librefang_min_version: str | None = None
    integrity: dict[str, str] = Field(default_factory=dict)
    plugin_depends: list[str] = Field(default_factory=list)
    config: dict[str, ConfigField] = Field(default_factory=dict)
    requires: list[Requirement] = Field(default_factory=list)
    i18n: dict[str, I18nEntry] = Field(default_factory=dict)
    needs: list[str] = Field(default_factory=list)
    wasm: dict[str, Any] = Field(default_factory=dict)  # [wasm] capabilities of runtime "wasm" (engine/wasm/)
    # Ours (docs/scale-out.md): "agent" sends all of one agent's jobs to one live worker host, for plugins that keep
    # per-agent state on disk; "none" lets any worker take any job.
    affinity: Literal["none", "agent"] = "none"

    @property
    def wasm_capabilities(self) -> tuple[str, ...]:
        """`[wasm] capabilities`: the host calls a wasm plugin declares (engine/wasm/host.py `declared`)."""
        caps = self.wasm.get("capabilities")
        return tuple(str(c) for c in caps) if isinstance(caps, list | tuple) else ()

    @field_validator("env", mode="before")
    @classmethod
    def _stringify_env(cls, v: Any) -> Any:
        if isinstance(v, dict):
            return {str(k): val if isinstance(val, str) else str(val).lower() if isinstance(val, bool) else str(val)
                    for k, val in v.items()}
        return v

    @property
    def runtime(self) -> ResolvedRuntime:
        return resolve_tag(self.hooks.runtime)

    def display_name(self, lang: str | None = None) -> str:
        """[i18n] name for an Accept-Language value: exact tag, then its base tag (zh-TW -> zh), then English."""
        return self._localized(lang, "name") or self.name

    def display_description(self, lang: str | None = None) -> str:
        """[i18n] description, looked up as display_name."""
        return self._localized(lang, "description") or self.description

    def _localized(self, lang: str | None, field: str) -> str:
        """The first [i18n] entry of the candidate languages that sets `field`; "" when none does."""
        for key in _lang_candidates(lang):
            entry = self.i18n.get(key)
            if entry and getattr(entry, field):
                return getattr(entry, field)
        return ""


def _lang_candidates(lang: str | None) -> list[str]:
    if not lang:
        return ["en"]
    first = lang.split(",")[0].split(";")[0].strip()
    return [first, first.split("-")[0], "en"]


class ManifestError(Exception):
    def __init__(self, findings: list[Finding]):
        self.findings = findings
        super().__init__("; ".join(f.message for f in findings if f.severity == F.ERROR))


def normalise_raw(raw: dict[str, Any]) -> tuple[dict[str, Any], list[Finding]]:
    """Fold `[context_engine_hooks]` and top-level execution keys into `hooks`; `[hooks]` wins."""
    found: list[Finding] = []
    data = dict(raw)
    hooks: dict[str, Any] = {}
    alias = data.pop("context_engine_hooks", None)
    if isinstance(alias, dict):
        hooks.update(alias)
    for key in list(data):
        if key in HOOK_SETTING_KEYS:
            hooks.setdefault(key, data.pop(key))
    explicit = data.pop("hooks", None)
    if explicit is not None and not isinstance(explicit, dict):
        found.append(F.error("manifest.hooks_not_table", "[hooks] must be a table", "Write `[hooks]` as a TOML table."))
        explicit = None
    for key, value in (explicit or {}).items():
        if key in hooks and hooks[key] != value:
            found.append(F.warning(
                "manifest.hooks_conflict",
                f"`{key}` is set both in [hooks] and elsewhere; the [hooks] value {value!r} wins",
                "Keep execution settings in one place, preferably [hooks].",
            ))
        hooks[key] = value
    data["hooks"] = hooks
    return data, found


def parse_manifest_text(text: str, expected_name: str | None = None) -> tuple[Manifest, list[Finding]]:
    """Parse plugin.toml text; raises ManifestError with findings when it cannot be used."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError([F.error("manifest.toml_syntax", f"plugin.toml is not valid TOML: {exc}",
                                     "Fix the TOML syntax; `python3 -c 'import tomllib'` can check it.")]) from exc
    data, found = normalise_raw(raw)
    found += _unknown_key_findings(data)
    try:
        manifest = Manifest.model_validate(_drop_unknown(data))
    except ValidationError as exc:
        raise ManifestError(found + [_validation_finding(err) for err in exc.errors()]) from exc
    if not NAME_RE.match(manifest.name):
        found.append(F.error("manifest.name_invalid", f"plugin name {manifest.name!r} is not allowed",
                             "Use 1-128 ASCII letters, digits, '-' or '_', starting with a letter or digit."))
    if expected_name is not None and manifest.name != expected_name:
        found.append(F.error("manifest.name_mismatch",
                             f"plugin.toml name {manifest.name!r} does not match directory {expected_name!r}",
                             "Rename the directory or change `name` so they match."))
    resolved = manifest.runtime
    if resolved.warning:
        # An error, not LibreFang's silent python fallback: `runtime = "cobol"` would run every hook with python3 and
        # fail with a SyntaxError while the dashboard said the plugin was fine.
        found.append(F.error("manifest.runtime_unknown", f"unknown runtime {manifest.hooks.runtime!r}: no hook can run (valid: "
                             f"{', '.join(sorted(RUNTIMES))})", "Use one of the listed runtime tags, or a path to a "
                             "launcher."))
    found += semantic_findings(manifest)
    if F.has_errors(found):
        raise ManifestError(found)
    return manifest, found


def version_tuple(text: str) -> tuple[int, ...] | None:
    """LibreFang's loose compare: the numeric dot parts before any '-' suffix."""
    core = text.strip().lstrip("vV").split("-")[0].split("+")[0]
    parts = []
    for piece in core.split("."):
        if not piece.isdigit():
            return None
        parts.append(int(piece))
    return tuple(parts) if parts else None


def semantic_findings(manifest: Manifest) -> list[Finding]:
    """Checks that need only the parsed manifest (no filesystem)."""
    out: list[Finding] = []
    if manifest.librefang_min_version:
        need = version_tuple(manifest.librefang_min_version)
        have = version_tuple(COMPAT_VERSION)
        if need is None:
            out.append(F.error("manifest.min_version_invalid",
                               f"librefang_min_version {manifest.librefang_min_version!r} is not a version",
                               "Write it as MAJOR.MINOR.PATCH, e.g. \"2026.4.0\"."))
        elif have is not None and need > have:
            out.append(F.error("manifest.min_version_unmet",
                               f"plugin needs LibreFang >= {manifest.librefang_min_version}; this engine implements "
                               f"{COMPAT_VERSION}", "Upgrade the service, or use an older release of the plugin."))
    if manifest.hooks.hook_protocol_version > HOOK_PROTOCOL_VERSION:
        out.append(F.warning("manifest.protocol_newer",
                             f"hook_protocol_version {manifest.hooks.hook_protocol_version} is newer than "
                             f"{HOOK_PROTOCOL_VERSION}; the plugin may expect fields this engine does not send",
                             "Check the plugin's documentation for the protocol version it needs."))
    if manifest.hooks.ingest_regex:
        try:
            re.compile(manifest.hooks.ingest_regex)
        except re.error as exc:
            out.append(F.warning("manifest.ingest_regex_invalid",
                                 f"ingest_regex {manifest.hooks.ingest_regex!r} is invalid ({exc}); it is ignored",
                                 "Fix the regular expression (Python `re` syntax)."))
    for need in manifest.needs:
        base = re.split(r"[<>=]", need, maxsplit=1)[0].strip()
        if base not in KNOWN_NEEDS and not NAME_RE.match(base):
            out.append(F.warning("manifest.needs_unknown", f"`needs` entry {need!r} is neither a capability nor a "
                                 "plugin name", f"Capabilities are: {', '.join(sorted(KNOWN_NEEDS))}."))
    for key, value in manifest.env.items():
        var = env_reference(value)
        if var is not None and var not in os.environ:
            out.append(F.warning("manifest.env_unset",
                                 f"[env] {key} = ${{{var}}}: {var} is not set in the service environment; the hook "
                                 "gets an empty string", f"Set {var} in the service's environment and restart it."))
    for key in manifest.hooks.env_schema:
        if key.startswith("!") and key[1:] not in manifest.env and key[1:] not in os.environ:
            out.append(F.warning("manifest.env_required_missing",
                                 f"env_schema marks {key[1:]} as required but it is neither in [env] nor set",
                                 f"Add {key[1:]} to [env] or to the service environment."))
    for field_name, cfg in manifest.config.items():
        if cfg.default is not None and not _config_type_ok(cfg.type, cfg.default):
            out.append(F.warning("manifest.config_default_type",
                                 f"[config] {field_name}: default {cfg.default!r} is not a {cfg.type}",
                                 "Make the default match the declared type."))
    return out


def env_reference(value: str) -> str | None:
    """`${VAR}` when the whole value is exactly one reference (LibreFang's only expansion form), else None."""
    m = re.fullmatch(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", value)
    return m.group(1) if m else None


def _config_type_ok(kind: str, value: Any) -> bool:
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, str)


def _drop_unknown(data: dict[str, Any]) -> dict[str, Any]:
    top = {k: v for k, v in data.items() if k in Manifest.model_fields}
    hooks = data.get("hooks") or {}
    top["hooks"] = {k: v for k, v in hooks.items() if k in HookSettings.model_fields}
    return top


def _unknown_key_findings(data: dict[str, Any]) -> list[Finding]:
    out = []
    for key in data:
        if key not in Manifest.model_fields:
            out.append(F.warning("manifest.unknown_key", f"unknown top-level key `{key}` is ignored",
                                 "Check the spelling against the plugin.toml reference."))
    for key in data.get("hooks") or {}:
        if key not in HookSettings.model_fields:
            out.append(F.warning("manifest.unknown_hook_key", f"unknown [hooks] key `{key}` is ignored",
                                 f"Hooks are: {', '.join(ALL_HOOKS)}."))
    return out


def _validation_finding(err: dict) -> Finding:
    loc = ".".join(str(p) for p in err.get("loc", ()))
    return F.error("manifest.invalid_field", f"`{loc}`: {err.get('msg')}", "Fix the value's type or range.")
