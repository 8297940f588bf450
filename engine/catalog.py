"""The installed plugins under $LIBREFANG_HOME/plugins, parsed once per change of their plugin.toml.

If plugin.toml changes on disk and no longer parses, the last good configuration keeps serving (and the problem
is reported), as LibreFang's reload promises.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from engine import findings as F
from engine.findings import Finding
from engine.home import Home
from engine.manifest import NAME_RE, LoadedPlugin, ManifestError, fingerprint, load_plugin

DISABLED_MARKER = ".disabled"


@dataclass
class CatalogEntry:
    name: str
    dir: Path
    plugin: LoadedPlugin | None  # None: never loaded successfully
    problems: list[Finding]  # errors of the current on-disk manifest (empty when it is the one serving)

    @property
    def valid(self) -> bool:
        return self.plugin is not None and not self.problems

    @property
    def enabled(self) -> bool:
        return not (self.dir / DISABLED_MARKER).exists()


class Catalog:
    def __init__(self, home: Home):
        self.home = home
        self._lock = threading.Lock()
        self._good: dict[str, LoadedPlugin] = {}

    def names(self) -> list[str]:
        root = self.home.plugins_dir
        if not root.is_dir():
            return []
        return sorted(p.name for p in root.iterdir() if p.is_dir() and (p / "plugin.toml").exists())

    def exists(self, name: str) -> bool:
        return bool(NAME_RE.match(name)) and (self.home.plugin_dir(name) / "plugin.toml").exists()

    def get(self, name: str) -> CatalogEntry:
        """The plugin as it should serve now. Raises KeyError when it is not installed."""
        if not self.exists(name):
            raise KeyError(name)
        pdir = self.home.plugin_dir(name)
        stamp = fingerprint(pdir)
        with self._lock:
            good = self._good.get(name)
        if good is not None and good.fingerprint == stamp:
            problems = _integrity_problems(good)
            return CatalogEntry(name, pdir, good if not problems else None, problems)
        try:
            loaded = load_plugin(pdir)
        except ManifestError as exc:
            stale = good
            if stale is not None:
                note = F.warning("manifest.stale", "plugin.toml on disk is invalid; the previous configuration keeps "
                                 "serving", "Fix plugin.toml and reload.")
                return CatalogEntry(name, pdir, stale, [*exc.findings, note])
            return CatalogEntry(name, pdir, None, exc.findings)
        with self._lock:
            self._good[name] = loaded
        return CatalogEntry(name, pdir, loaded, [])

    def validate(self, name: str) -> LoadedPlugin:
        """Parse plugin.toml now; on success it becomes the serving configuration. Raises ManifestError/KeyError."""
        if not self.exists(name):
            raise KeyError(name)
        loaded = load_plugin(self.home.plugin_dir(name))
        with self._lock:
            self._good[name] = loaded
        return loaded

    def forget(self, name: str) -> None:
        with self._lock:
            self._good.pop(name, None)


def _integrity_problems(plugin: LoadedPlugin) -> list[Finding]:
    # [integrity] and plugin_depends are enforced every time the engine uses the plugin, not only when plugin.toml
    # changes (a hook edited or a dependency uninstalled after load stops the plugin at once).
    from engine.manifest import directory_findings, verify_integrity

    problems = [f for f in directory_findings(plugin.dir, plugin.manifest) if f.severity == F.ERROR]
    if plugin.manifest.integrity:
        problems += verify_integrity(plugin.dir, plugin.manifest)
    return problems
