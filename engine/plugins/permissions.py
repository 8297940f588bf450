"""What a plugin may do beyond the defaults, and who said so (docs/security.md, "Permissions and approvals").

A plugin's files and its plugin.toml are attacker-controlled; the operator's config.toml and an owner's approvals are
not. So a hook gets:

- what its manifest asks beyond the defaults (`requested`: network, a wider filesystem, service variables, secrets,
  wasm host calls, limits above the defaults) only when an owner approved that very manifest version: an approval
  names the plugin and the sha256 of its plugin.toml (`Approvals`; the database keeps them,
  plugins_app/models.py `PluginApproval`). Any other version runs with the defaults in place of every ask, and the
  call's trace says so. A plugin that asks nothing beyond the defaults needs no approval;
- never more than the ceilings of `[limits]` in config.toml, whatever was asked or approved;
- a service variable only when `[plugin_env] allow` (or `[context_engine] allowed_env_vars`) lists it and it is not
  one of the service's own (`service_own`), listed or not.

`PermissionPolicy.grant` turns all of it into the `Grant` engine/invoke.py builds a hook call from.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from engine.config import Limits, ServiceConfig
from engine.hooks import DEFAULT_TIMEOUT_SECS, timeout_for
from engine.plugins.manifest import HookSettings, Manifest, env_reference
from engine.process.runner import DEFAULT_MAX_MEMORY_MB, DEFAULT_MAX_PROCESSES

# What every plugin gets without asking (the sandbox's defaults).
BASELINE_PROCESSES = DEFAULT_MAX_PROCESSES
BASELINE_MEMORY_MB = DEFAULT_MAX_MEMORY_MB
BASELINE_TIMEOUT_SECS = DEFAULT_TIMEOUT_SECS
BASELINE_FILESYSTEM = bool(HookSettings.model_fields["allow_filesystem"].default)

# Names that look like credentials: never expanded into a hook, and masked wherever a manifest's [env] is shown.
SECRET_WORDS = re.compile(r"KEY|SECRET|PASSWORD|PASSWD|TOKEN|CREDENTIAL", re.IGNORECASE)
SERVICE_VARS = frozenset({"REDIS_URL", "DATABASE_URL"})
SERVICE_PREFIXES = ("LIBREFANG_", "DJANGO_")


def looks_secret(name: str) -> bool:
    return bool(SECRET_WORDS.search(name))


def service_own(var: str) -> bool:
    """The service's own variables (its Redis, its database, its settings, anything named like a credential): no
    hook ever gets their values, whatever config.toml lists."""
    upper = var.upper()
    return upper in SERVICE_VARS or upper.startswith(SERVICE_PREFIXES) or looks_secret(var)


def masked_env(env: dict[str, str]) -> dict[str, str]:
    """[env] as a viewer may see it: values of keys named like a credential shown as `***`."""
    return {k: "***" if looks_secret(k) else v for k, v in env.items()}


@dataclass(frozen=True)
class Request:
    """What one manifest version asks beyond the defaults. Empty for a plugin that asks nothing."""

    network: bool = False
    filesystem: bool = False
    env_vars: tuple[str, ...] = ()  # service variables: [env] "${VAR}" values and allowed_env_vars
    secrets: tuple[str, ...] = ()  # allowed_secrets (LIBREFANG_SECRET_<NAME> of the service environment)
    wasm_capabilities: tuple[str, ...] = ()
    max_processes: int | None = None  # set only above the default
    max_memory_mb: int | None = None
    hook_timeout_secs: float | None = None

    @property
    def empty(self) -> bool:
        return self == Request()

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: Any) -> Request:
        data = data if isinstance(data, dict) else {}

        def names(key: str) -> tuple[str, ...]:
            value = data.get(key)
            return tuple(sorted({str(v) for v in value})) if isinstance(value, list) else ()

        def number(key: str) -> Any:
            value = data.get(key)
            return value if isinstance(value, int | float) and not isinstance(value, bool) else None

        return cls(network=data.get("network") is True, filesystem=data.get("filesystem") is True,
                   env_vars=names("env_vars"), secrets=names("secrets"), wasm_capabilities=names("wasm_capabilities"),
                   max_processes=number("max_processes"), max_memory_mb=number("max_memory_mb"),
                   hook_timeout_secs=number("hook_timeout_secs"))

    def asks(self) -> list[dict[str, Any]]:
        """One line per ask, as the dashboard, the API and the CLI show them."""
        out: list[dict[str, Any]] = []
        if self.network:
            out.append(_ask("network", True, "network access (allow_network = true)"))
        if self.filesystem:
            out.append(_ask("filesystem", True, "a wider view of the filesystem (allow_filesystem = true)"))
        out += [_ask(f"env:{v}", v, f"the service variable {v}") for v in self.env_vars]
        out += [_ask(f"secret:{s}", s, f"the secret {s}") for s in self.secrets]
        out += [_ask(f"wasm:{c}", c, f"the wasm host call {c}") for c in self.wasm_capabilities]
        for key, default, unit in LIMIT_ASKS:
            value = getattr(self, key)
            if value is not None:
                out.append(_ask(key, value, f"{key} = {value:g}{unit} (default {default:g}{unit})"))
        return out


LIMIT_ASKS = (("max_processes", BASELINE_PROCESSES, ""), ("max_memory_mb", BASELINE_MEMORY_MB, " MB"),
              ("hook_timeout_secs", BASELINE_TIMEOUT_SECS, " s"))


def _ask(key: str, value: Any, label: str) -> dict[str, Any]:
    return {"key": key, "value": value, "label": label}


def requested(manifest: Manifest) -> Request:
    """What `manifest` asks beyond the defaults."""
    h = manifest.hooks
    refs = {env_reference(v) for v in manifest.env.values()}
    env_vars = {v for v in refs if v} | set(h.allowed_env_vars)

    def above(value: Any, baseline: float) -> Any:
        return value if value is not None and value > baseline else None

    return Request(
        network=h.allow_network,
        filesystem=h.allow_filesystem and not BASELINE_FILESYSTEM,
        env_vars=tuple(sorted(env_vars)), secrets=tuple(sorted(set(h.allowed_secrets))),
        wasm_capabilities=tuple(sorted(set(manifest.wasm_capabilities))),
        max_processes=above(h.max_processes, BASELINE_PROCESSES),
        max_memory_mb=above(h.max_memory_mb, BASELINE_MEMORY_MB),
        hook_timeout_secs=above(h.hook_timeout_secs, BASELINE_TIMEOUT_SECS),
    )


def covered(new: Request, approved: Request) -> bool:
    """Whether `new` asks for nothing `approved` did not grant (an update that adds no permission)."""
    def within(a: Any, b: Any) -> bool:
        return a is None or (b is not None and a <= b)

    return ((not new.network or approved.network) and (not new.filesystem or approved.filesystem)
            and set(new.env_vars) <= set(approved.env_vars) and set(new.secrets) <= set(approved.secrets)
            and set(new.wasm_capabilities) <= set(approved.wasm_capabilities)
            and all(within(getattr(new, k), getattr(approved, k)) for k, _d, _u in LIMIT_ASKS))


def changes(before: Request | None, after: Request) -> dict[str, list[dict[str, Any]]]:
    """What `after` asks that `before` (the last approved version) did not, and what it no longer asks."""
    old = {a["key"]: a for a in (before or Request()).asks()}
    new = {a["key"]: a for a in after.asks()}
    return {"added": [a for k, a in new.items() if k not in old or old[k]["value"] != a["value"]],
            "removed": [a for k, a in old.items() if k not in new or new[k]["value"] != a["value"]]}


class Approvals(Protocol):
    """Which manifest versions an owner approved (plugins_app/selectors/permissions.py keeps them in the database)."""

    def approved(self, plugin: str, manifest_sha256: str) -> bool: ...


class NoApprovals:
    """Nothing approved: every plugin runs with the defaults in place of its asks (the engine's own default)."""

    def approved(self, plugin: str, manifest_sha256: str) -> bool:
        return False


@dataclass
class MemoryApprovals:
    """Approvals held in memory (engine tests, tools that run without the database)."""

    versions: set[tuple[str, str]] = field(default_factory=set)

    def approve(self, plugin: str, manifest_sha256: str) -> None:
        self.versions.add((plugin, manifest_sha256))

    def approved(self, plugin: str, manifest_sha256: str) -> bool:
        return (plugin, manifest_sha256) in self.versions


@dataclass(frozen=True)
class Grant:
    """What one call of a plugin's hook gets: its asks if approved, the defaults otherwise, within the ceilings."""

    in_force: bool  # the version's asks apply (it asks nothing, or this version is approved)
    network: bool
    filesystem: bool
    env_vars: frozenset[str]  # service variables the hook may read
    secrets: tuple[str, ...]
    wasm_capabilities: tuple[str, ...]
    max_processes: int
    max_memory_mb: int
    max_cpu_secs: int | None
    hook_timeout_secs: float
    max_disk_mb: int
    timeout_ceiling: float
    warnings: tuple[str, ...] = ()

    def timeout_for(self, hook: str) -> float:
        """One attempt's time: the hook's timeout rule (engine/hooks.py) over the granted timeout, within the
        ceiling (bootstrap's double included)."""
        return min(timeout_for(hook, self), self.timeout_ceiling)


def grant(name: str, manifest: Manifest, request: Request, approved: bool, limits: Limits,
          env_allow: frozenset[str]) -> Grant:
    """The Grant of one manifest version (see the module docstring)."""
    h = manifest.hooks
    in_force = approved or request.empty
    warnings: list[str] = []
    if not in_force:
        asked = ", ".join(a["label"] for a in request.asks())
        warnings.append(f"permissions.unapproved: this version of {name}'s plugin.toml is not approved; it runs with "
                        f"the defaults instead of: {asked} (approve it: librefang plugin approve {name})")
    env_vars = set()
    for var in request.env_vars if in_force else ():
        if service_own(var):
            warnings.append(f"permissions.env_refused: {var} is the service's own and never reaches a hook")
        elif var not in env_allow:
            warnings.append(f"permissions.env_not_allowed: {var} is not in [plugin_env] allow of config.toml")
        else:
            env_vars.add(var)

    def capped(key: str, asked: Any, baseline: float, ceiling: float) -> Any:
        value = asked if asked is not None else baseline
        if not in_force:
            value = min(value, baseline)
        if value > ceiling:
            warnings.append(f"permissions.ceiling: {key} = {value:g} is above the operator's ceiling; the hook gets "
                            f"{ceiling:g} ([limits] of config.toml)")
            value = ceiling
        return value

    cpu = h.max_cpu_secs
    if limits.max_cpu_secs is not None:
        cpu = min(cpu or limits.max_cpu_secs, limits.max_cpu_secs)
    return Grant(
        in_force=in_force,
        network=h.allow_network and in_force,
        filesystem=h.allow_filesystem if in_force or not request.filesystem else BASELINE_FILESYSTEM,
        env_vars=frozenset(env_vars),
        secrets=request.secrets if in_force else (),
        wasm_capabilities=tuple(manifest.wasm_capabilities) if in_force else (),
        max_processes=int(capped("max_processes", h.max_processes, BASELINE_PROCESSES, limits.max_processes)),
        max_memory_mb=int(capped("max_memory_mb", h.max_memory_mb, BASELINE_MEMORY_MB, limits.max_memory_mb)),
        max_cpu_secs=cpu,
        hook_timeout_secs=capped("hook_timeout_secs", h.hook_timeout_secs, BASELINE_TIMEOUT_SECS,
                                 limits.hook_timeout_secs),
        max_disk_mb=limits.max_disk_mb,
        timeout_ceiling=limits.hook_timeout_secs,
        warnings=tuple(warnings),
    )


@dataclass(frozen=True)
class PermissionPolicy:
    """The operator's side of every grant: approvals, ceilings and the variables plugins may ask for."""

    approvals: Approvals = field(default_factory=NoApprovals)
    limits: Limits = field(default_factory=Limits)
    env_allow: frozenset[str] = frozenset()

    @classmethod
    def of(cls, cfg: ServiceConfig, approvals: Approvals) -> PermissionPolicy:
        return cls(approvals, cfg.limits,
                   frozenset(cfg.plugin_env.allow) | frozenset(cfg.context_engine.allowed_env_vars))

    def grant(self, plugin: Any) -> Grant:
        """The Grant of a loaded plugin (engine/plugins/loader.py LoadedPlugin: its manifest, what it asks and the
        sha256 of its plugin.toml). The approvals are asked only when the plugin asks for something."""
        request = plugin.requested
        approved = not request.empty and self.approvals.approved(plugin.name, plugin.manifest_sha256)
        return grant(plugin.name, plugin.manifest, request, approved, self.limits, self.env_allow)
