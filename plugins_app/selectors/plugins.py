"""Reads about installed plugins: what the dashboard and API list."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine import hook_policy
from engine.hooks import ALL_HOOKS, timeout_for
from engine.plugins.catalog import CatalogEntry
from engine.plugins.manifest import HookSettings
from engine.process.runner import resolve_script
from plugins_app.errors import PluginError
from plugins_app.home import catalog, config_cache
from plugins_app.selectors import outcomes


@dataclass
class PluginSummary:
    name: str
    display_name: str
    version: str
    description: str
    author: str
    runtime: str
    enabled: bool
    valid: bool
    hooks: dict[str, str | None]
    hooks_valid: bool
    path: str
    findings: list[dict] = field(default_factory=list)
    # why no hook can run although the plugin may be enabled ("deno not installed"), None when it can run
    cannot_run: str | None = None
    # configured in the active plugin/plugin_stack (engine/config.py); serving = in it, enabled and able to run
    in_chain: bool = False
    # hooks whose recent agent calls fail (plugins_app/selectors/outcomes.py): {hook: {calls, failures, …}}
    failing: dict[str, dict] = field(default_factory=dict)

    @property
    def serving(self) -> bool:
        return self.in_chain and self.enabled and not self.cannot_run

    @property
    def state(self) -> str:
        """One word for sorting and filtering: invalid, cannot_run, disabled, enabled."""
        if not self.valid and self.cannot_run:
            return "invalid"
        if self.cannot_run:
            return "cannot_run"
        return "enabled" if self.enabled else "disabled"

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def summarize(entry: CatalogEntry, lang: str | None = None, chain: list[str] | None = None,
              failing: dict[str, dict[str, dict]] | None = None) -> PluginSummary:
    plugin = entry.plugin
    manifest = plugin.manifest if plugin else None
    hooks = {h: (manifest.hooks.script_for(h) if manifest else None) for h in ALL_HOOKS}
    hooks_valid = True
    for script in filter(None, hooks.values()):
        try:
            resolve_script(entry.dir, script)
        except (ValueError, FileNotFoundError):
            hooks_valid = False
    findings = [f.to_dict() for f in (entry.problems or [])] + [f.to_dict() for f in (plugin.findings if plugin else [])]
    return PluginSummary(
        name=entry.name,
        display_name=manifest.display_name(lang) if manifest else entry.name,
        version=manifest.version if manifest else "",
        description=manifest.description if manifest else "",
        author=manifest.author if manifest else "",
        runtime=manifest.runtime.label if manifest else "",
        enabled=entry.enabled,
        valid=entry.valid,
        hooks=hooks,
        hooks_valid=hooks_valid and plugin is not None,
        path=str(entry.dir),
        findings=findings,
        cannot_run=entry.cannot_run,
        in_chain=entry.name in (chain if chain is not None else _configured_chain()),
        failing=(failing if failing is not None else outcomes.failing(entry.name)).get(entry.name, {}),
    )


def _configured_chain() -> list[str]:
    return list(config_cache().get().context_engine.chain)


def list_plugins(lang: str | None = None) -> list[PluginSummary]:
    installed = catalog()
    chain = _configured_chain()
    bad = outcomes.failing()
    return [summarize(installed.get(name), lang, chain, bad) for name in installed.names()]


def get_plugin(name: str, lang: str | None = None) -> PluginSummary | None:
    entry = installed_entry(name)
    return summarize(entry, lang) if entry is not None else None


def installed_entry(name: str) -> CatalogEntry | None:
    """The catalog's entry for an installed plugin (its manifest, directory, state), None when not installed."""
    installed = catalog()
    if not installed.exists(name):
        return None
    try:
        return installed.get(name)
    except KeyError:  # uninstalled meanwhile
        return None


def hook_timeout_secs(name: str, hook: str) -> float:
    """How long one attempt of `hook` may take for this plugin (engine/hooks.py timeout_for: its
    hook_timeout_secs, doubled for bootstrap; the default when the plugin cannot be loaded)."""
    entry = installed_entry(name)
    return timeout_for(hook, entry.plugin.manifest.hooks if entry is not None and entry.plugin is not None else None)


def runnable_hooks(name: str, hooks: list[str] | None = None, enabled: bool = False) -> HookSettings:
    """The [hooks] settings of an installed plugin that loads (and is enabled, when asked) and declares every hook
    in `hooks`; else PluginError: not_found, invalid_manifest, plugin_disabled, hook_not_declared. What the test
    console and the benchmark refuse before they run anything."""
    entry = installed_entry(name)
    if entry is None:
        raise PluginError("not_found", f"plugin {name!r} is not installed", 404)
    if entry.plugin is None:
        raise PluginError("invalid_manifest", f"plugin {name!r} cannot be loaded", 400,
                          [f.to_dict() for f in entry.problems])
    if enabled and not entry.enabled:
        raise PluginError("plugin_disabled", f"plugin {name!r} is disabled; enable it to benchmark it", 409)
    settings = entry.plugin.manifest.hooks
    declared = sorted(settings.declared_hooks())
    for hook in hooks or ():
        if hook not in declared:
            raise PluginError("hook_not_declared", f"plugin {name!r} does not declare the {hook} hook", 400,
                              {"declared": declared})
    return settings


def installed_names() -> list[str]:
    return catalog().names()


def is_installed(name: str) -> bool:
    return catalog().exists(name)


def active_chain() -> dict:
    cfg = config_cache().get()
    installed = catalog()
    enabled = hook_policy.chain(installed, cfg)
    blocked = {n: installed.get(n).cannot_run for n in enabled}
    failing = outcomes.failing()
    return {"mode": cfg.context_engine.mode, "configured": cfg.context_engine.chain,
            "serving": [n for n in enabled if not blocked[n]],
            "failing": [f"{n} ({', '.join(failing[n])})" for n in enabled if n in failing],
            "cannot_run": [{"plugin": n, "why": why} for n, why in blocked.items() if why],
            "skipped": hook_policy.skipped_layers(installed, cfg), "config_error": cfg.error}
