"""What the configured plugin registries offer (GET /plugins/registries, /plugins/registry/search), read through
engine/plugins/registry.py: a signed index is verified against the operator's key before anything in it is shown.
Also which registries config.toml's `[plugins]` names, read here for installs and updates too."""

from __future__ import annotations

import tomllib

from engine.plugins import install as I
from engine.plugins import registry as R
from plugins_app.errors import PluginError
from plugins_app.home import catalog as plugin_catalog
from plugins_app.home import home


def _raw_config() -> dict:
    try:
        return tomllib.loads(home().config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def default_registry() -> str | None:
    """The registry a bare plugin name installs from: `[plugins] registry`, else the first of plugin_registries."""
    plugins = _raw_config().get("plugins")
    if isinstance(plugins, dict):
        reg = plugins.get("registry") or plugins.get("default_registry")
        if isinstance(reg, str):
            return reg
        regs = plugins.get("plugin_registries")
        if isinstance(regs, list) and regs:
            first = regs[0]
            if isinstance(first, str):
                return first
            if isinstance(first, dict) and isinstance(first.get("github_repo") or first.get("url"), str):
                return first.get("github_repo") or first.get("url")
    return None


def registry_configs() -> list[R.RegistryConfig]:
    """The registries of `[plugins]` in config.toml, each with its trust settings (engine/plugins/registry.py)."""
    return R.parse_registries(_raw_config().get("plugins"))


def _installed() -> dict[str, str]:
    catalog = plugin_catalog()
    out = {}
    for name in catalog.names():
        try:
            plugin = catalog.get(name).plugin
        except KeyError:
            continue
        out[name] = plugin.manifest.version if plugin is not None else ""
    return out


def _listing(cfg: R.RegistryConfig) -> R.Listing:
    try:
        with I.registry_root(I.registry_location(cfg.location, None)) as (root, _prov):
            return I.registry_listing(root, cfg)
    except I.InstallError as exc:
        raise PluginError(exc.code, exc.message, 502 if exc.code == "git_failed" else exc.status) from exc


def _config(registry: str | None) -> R.RegistryConfig:
    """A configured registry, by location or name. Reads never fetch a location nobody configured: a viewer must
    not be able to make the service clone arbitrary URLs (installing from any source is an owner's act)."""
    configs = registry_configs()
    if registry:
        for cfg in configs:
            if registry in (cfg.location, cfg.name):
                return cfg
        raise PluginError("unknown_registry", f"{registry!r} is not a configured registry ([plugins] registry or "
                                              "plugin_registries in config.toml)", 400)
    if not configs:
        raise PluginError("no_registry", "no registry given and none configured ([plugins] registry or "
                                         "plugin_registries in config.toml)", 400)
    return configs[0]


def search(query: str, registry: str | None = None) -> dict:
    cfg = _config(registry)
    listing = _listing(cfg)
    results = R.search(listing, query, _installed())
    return {"registry": cfg.name or cfg.location, "location": cfg.location, "query": query, "results": results,
            "total": len(results), "source": listing.source, "signed": listing.signed}


def registries() -> dict:
    """Every configured registry with its plugins, or the error that kept it from being read."""
    installed = _installed()
    out = []
    for cfg in registry_configs():
        row = {**cfg.to_dict()}
        try:
            listing = _listing(cfg)
        except PluginError as exc:
            out.append({**row, "error": exc.to_dict(), "plugins": []})
            continue
        out.append({**row, "signed": listing.signed, "source": listing.source,
                    "plugins": R.search(listing, "", installed)})
    return {"registries": out, "total": len(out)}
