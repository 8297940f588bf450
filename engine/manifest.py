"""`plugin.toml`: parsed with pydantic, accepting both LibreFang's docs and its real code.

Execution keys are read from `[hooks]` and from the top level (the docs and the official mempalace plugin put them
there); `[context_engine_hooks]` is an alias of `[hooks]`; `[hooks]` wins on conflict. Unknown keys become findings.
"""

from __future__ import annotations

import hashlib
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from engine import findings as F
from engine.findings import Finding
from engine.hooks import ALL_HOOKS
from engine.runtimes import ResolvedRuntime, resolve_tag

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")
DEFAULT_TIMEOUT_SECS = 30.0


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
    allow_network: bool = True
    allow_filesystem: bool = True
    max_memory_mb: int | None = Field(None, gt=0)
    max_cpu_secs: int | None = Field(None, gt=0)
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
        for key in _lang_candidates(lang):
            entry = self.i18n.get(key)
            if entry and entry.name:
                return entry.name
        return self.name


def _lang_candidates(lang: str | None) -> list[str]:
    if not lang:
        return ["en"]
    first = lang.split(",")[0].split(";")[0].strip()
    return [first, first.split("-")[0], "en"]


class ManifestError(Exception):
    def __init__(self, findings: list[Finding]):
        self.findings = findings
        super().__init__("; ".join(f.message for f in findings if f.severity == F.ERROR))


@dataclass
class LoadedPlugin:
    """A parsed plugin directory. `findings` carries warnings; a plugin with errors never becomes a LoadedPlugin."""

    dir: Path
    manifest: Manifest
    findings: list[Finding] = field(default_factory=list)
    fingerprint: tuple = ()

    @property
    def name(self) -> str:
        return self.manifest.name


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
        found.append(F.warning("manifest.runtime_unknown", resolved.warning, "Use one of the listed runtime tags."))
    if F.has_errors(found):
        raise ManifestError(found)
    return manifest, found


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


def manifest_path(plugin_dir: Path) -> Path:
    return plugin_dir / "plugin.toml"


def fingerprint(plugin_dir: Path) -> tuple:
    """Changes whenever plugin.toml changes on disk (cheap: one stat)."""
    try:
        st = os.stat(manifest_path(plugin_dir))
    except OSError:
        return ()
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def load_plugin(plugin_dir: Path, check_integrity: bool = True) -> LoadedPlugin:
    """Read and validate a plugin directory; raises ManifestError."""
    path = manifest_path(plugin_dir)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ManifestError([F.error("manifest.missing", f"{path} does not exist",
                                     "A plugin directory needs a plugin.toml at its root.")]) from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ManifestError([F.error("manifest.unreadable", f"cannot read {path}: {exc}", "")]) from exc
    manifest, found = parse_manifest_text(text, expected_name=plugin_dir.name)
    if check_integrity:
        problems = verify_integrity(plugin_dir, manifest)
        if problems:
            raise ManifestError(found + problems)
    return LoadedPlugin(plugin_dir, manifest, found, fingerprint(plugin_dir))


def verify_integrity(plugin_dir: Path, manifest: Manifest) -> list[Finding]:
    out = []
    for rel, expected in manifest.integrity.items():
        target = (plugin_dir / rel)
        try:
            digest = hashlib.sha256(target.read_bytes()).hexdigest()
        except OSError as exc:
            out.append(F.error("integrity.unreadable", f"[integrity] file {rel} cannot be read: {exc}",
                               "Restore the file or re-sign the plugin."))
            continue
        if digest != expected.lower():
            out.append(F.error("integrity.mismatch", f"[integrity] sha256 of {rel} does not match",
                               "The file changed after signing: restore it, or re-sign if the change is yours."))
    return out
