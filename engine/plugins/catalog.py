"""The installed plugins under $LIBREFANG_HOME/plugins, parsed once per change of their plugin.toml.

If plugin.toml changes on disk and no longer parses, the last good configuration keeps serving (and the problem
is reported), as LibreFang's reload promises. The last good plugin.toml is kept on disk (in the plugin's data dir)
and that copy is the one source of truth for every process: the web tier (deadlines) and every worker (timeouts)
serve exactly the configuration that last loaded in ANY process, never an older one one of them happened to keep
in memory.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine import findings as F
from engine.findings import Finding
from engine.home import Home
from engine.plugins.loader import (
    LoadedPlugin,
    directory_findings,
    fingerprint,
    load_plugin,
    manifest_path,
    manifest_sha256,
    verify_integrity,
)
from engine.plugins.manifest import NAME_RE, ManifestError, parse_manifest_text
from engine.process.runtimes import find_launcher

DISABLED_MARKER = ".disabled"
LAST_GOOD_FILE = "last_good_plugin.toml"


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

    @property
    def cannot_run(self) -> str | None:
        """Why no hook of this plugin can run now (shown next to "enabled"), or None when it can."""
        if self.plugin is None:
            first = next((f.message for f in self.problems if f.severity == F.ERROR), "")
            return f"invalid manifest: {first}" if first else "invalid manifest"
        resolved = self.plugin.manifest.runtime
        if resolved.custom_launcher:
            if not os.access(resolved.custom_launcher, os.X_OK):
                return f"launcher {resolved.custom_launcher} is missing or not executable"
            return None
        if resolved.runtime.launcher and find_launcher(resolved.runtime.tag) is None:
            return f"{resolved.runtime.launcher} not installed"
        return None


class Catalog:
    def __init__(self, home: Home):
        self.home = home
        self._lock = threading.Lock()
        self._good: dict[str, LoadedPlugin] = {}
        # name -> (stamp of the last-good file, the plugin restored from it): re-parsed only when that file changes
        self._stale: dict[str, tuple[tuple, LoadedPlugin]] = {}

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
            # the on-disk last-good copy first: another process may have loaded a newer good version than the one
            # this process keeps in memory (see the module docstring)
            stale = self._restore_last_good(name, pdir) or good
            if stale is not None:
                note = F.warning("manifest.stale", "plugin.toml on disk is invalid; the previous configuration keeps "
                                 "serving", "Fix plugin.toml and reload.")
                return CatalogEntry(name, pdir, stale, [*exc.findings, note])
            return CatalogEntry(name, pdir, None, exc.findings)
        with self._lock:
            self._good[name] = loaded
        self._save_last_good(name, pdir)
        return CatalogEntry(name, pdir, loaded, [])

    def peek(self, name: str) -> CatalogEntry:
        """The plugin as `get` returns it, except that a plugin.toml unchanged since it loaded is taken as it is,
        without re-checking the hook files and integrity: for a deadline, which needs only the manifest's
        timeouts (the checks run where the hook runs: a plugin that fails them answers at once). One stat instead
        of `get`'s walk of every hook path. Raises KeyError when it is not installed."""
        pdir = self.home.plugin_dir(name) if NAME_RE.match(name) else None
        stamp = fingerprint(pdir) if pdir is not None else ()
        with self._lock:
            good = self._good.get(name)
        if stamp and good is not None and good.fingerprint == stamp:
            return CatalogEntry(name, pdir, good, [])
        return self.get(name)

    def validate(self, name: str) -> LoadedPlugin:
        """Parse plugin.toml now; on success it becomes the serving configuration. Raises ManifestError/KeyError."""
        if not self.exists(name):
            raise KeyError(name)
        loaded = load_plugin(self.home.plugin_dir(name))
        with self._lock:
            self._good[name] = loaded
        self._save_last_good(name, self.home.plugin_dir(name))
        return loaded

    def _save_last_good(self, name: str, pdir: Path) -> None:
        """Keep a copy of plugin.toml as it was when it loaded (re-parsed, in case it changed meanwhile)."""
        try:
            text = manifest_path(pdir).read_text(encoding="utf-8")
            parse_manifest_text(text, expected_name=name)
            target = self.home.data_dir(name) / LAST_GOOD_FILE
            if target.exists() and target.read_text(encoding="utf-8") == text:
                return
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_suffix(".tmp")
            tmp.write_text(text, encoding="utf-8")
            tmp.replace(target)
        except (OSError, UnicodeDecodeError, ManifestError):
            pass

    def last_good_path(self, name: str) -> Path:
        return self.home.data_dir(name) / LAST_GOOD_FILE

    def _restore_last_good(self, name: str, pdir: Path) -> LoadedPlugin | None:
        """The saved last good configuration, if it still fits the directory (hooks present, integrity intact)."""
        path = self.last_good_path(name)
        stamp = _file_stamp(path)
        if not stamp:
            return None
        with self._lock:
            cached = self._stale.get(name)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        try:
            text = path.read_text(encoding="utf-8")
            manifest, found = parse_manifest_text(text, expected_name=name)
        except (OSError, UnicodeDecodeError, ManifestError):
            return None
        found = [*found, *directory_findings(pdir, manifest), *verify_integrity(pdir, manifest)]
        if F.has_errors(found):
            return None
        restored = LoadedPlugin(pdir, manifest, found, ("last_good", *stamp), manifest_sha256(text))
        with self._lock:
            self._stale[name] = (stamp, restored)
        return restored

    def forget(self, name: str) -> None:
        with self._lock:
            self._good.pop(name, None)
            self._stale.pop(name, None)


def _file_stamp(path: Path) -> tuple:
    try:
        st = path.stat()
    except OSError:
        return ()
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def _integrity_problems(plugin: LoadedPlugin) -> list[Finding]:
    # [integrity] and plugin_depends are enforced every time the engine uses the plugin, not only when plugin.toml
    # changes (a hook edited or a dependency uninstalled after load stops the plugin at once).
    problems = [f for f in directory_findings(plugin.dir, plugin.manifest) if f.severity == F.ERROR]
    if plugin.manifest.integrity:
        problems += verify_integrity(plugin.dir, plugin.manifest)
    return problems


class PinnedCatalog:
    """The catalog as one job sees it: the plugins it names run from the given (bundle) directories, exactly that
    version; any other name falls back to the local catalog (absent on a worker host without an authoring dir).

    Bundle directories never change (engine/plugins/bundles.py), so each is parsed once per process.
    """

    _loaded: dict[Path, CatalogEntry] = {}
    _loaded_lock = threading.Lock()

    def __init__(self, base: Catalog, dirs: dict[str, Path]):
        self.home = base.home
        self._base = base
        self._dirs = dirs

    def names(self) -> list[str]:
        return sorted(set(self._base.names()) | set(self._dirs))

    def exists(self, name: str) -> bool:
        return name in self._dirs or self._base.exists(name)

    def get(self, name: str) -> CatalogEntry:
        pdir = self._dirs.get(name)
        if pdir is None:
            return self._base.get(name)
        with self._loaded_lock:
            entry = self._loaded.get(pdir)
        if entry is None:
            try:
                loaded = load_plugin(pdir)
                entry = CatalogEntry(name, pdir, loaded, _integrity_problems(loaded))
                if entry.problems:
                    entry = CatalogEntry(name, pdir, None, entry.problems)
            except ManifestError as exc:
                entry = CatalogEntry(name, pdir, None, exc.findings)
            with self._loaded_lock:
                self._loaded[pdir] = entry
        return entry

    def validate(self, name: str) -> LoadedPlugin:
        return self._base.validate(name)

    def last_good_path(self, name: str) -> Path:
        return self._base.last_good_path(name)

    def forget(self, name: str) -> None:
        self._base.forget(name)


class CallCatalog:
    """The catalog as one call sees it: each plugin looked up once. Catalog.get stats the plugin's directory and
    checks its hook paths and integrity on every lookup; a call needs that once, not once per step (chain, filters,
    run, failure policy). `manifests_only`: looked up with Catalog.peek (a deadline's chain and timeouts)."""

    def __init__(self, catalog: Any, manifests_only: bool = False):
        self._catalog = catalog
        self.home = catalog.home
        self._entries: dict[str, Any] = {}
        self._lookup = getattr(catalog, "peek", catalog.get) if manifests_only else catalog.get

    def _entry(self, name: str) -> Any:
        if name not in self._entries:
            try:
                self._entries[name] = self._lookup(name)
            except KeyError:  # not installed
                self._entries[name] = None
        return self._entries[name]

    def exists(self, name: str) -> bool:
        return self._entry(name) is not None

    def get(self, name: str) -> Any:
        entry = self._entry(name)
        if entry is None:
            raise KeyError(name)
        return entry

    def __getattr__(self, attr: str) -> Any:  # names(), validate(), ...: the catalog's own
        return getattr(self._catalog, attr)
