"""Reads about installed plugins: what the dashboard and API list."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.catalog import CatalogEntry
from engine.hooks import ALL_HOOKS
from engine.runner import resolve_script
from plugins_app.services.engine import get_engine


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

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def summarize(entry: CatalogEntry, lang: str | None = None) -> PluginSummary:
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
    )


def list_plugins(lang: str | None = None) -> list[PluginSummary]:
    catalog = get_engine().catalog
    return [summarize(catalog.get(name), lang) for name in catalog.names()]


def get_plugin(name: str, lang: str | None = None) -> PluginSummary | None:
    catalog = get_engine().catalog
    if not catalog.exists(name):
        return None
    return summarize(catalog.get(name), lang)


def active_chain() -> dict:
    engine = get_engine()
    cfg = engine.config.get()
    return {"mode": cfg.context_engine.mode, "configured": cfg.context_engine.chain, "serving": engine.chain(cfg),
            "config_error": cfg.error}
