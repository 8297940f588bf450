"""Plugin install, update and uninstall on disk: a fetched source (engine/plugins/sources.py) checked (manifest and
[integrity]) in a staging directory, then moved into place, and the lockfile $LIBREFANG_HOME/plugins.lock
(per-file sha256).

Pure Python (git is run as a subprocess). The Django side adds audit, idempotency and events around it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from engine.home import Home
from engine.plugins import registry as R
from engine.plugins.loader import load_plugin
from engine.plugins.manifest import NAME_RE, ManifestError, parse_manifest_text
from engine.plugins.sources import (  # noqa: F401 - Source, InstallError and check_git_ref are part of this module's API
    SIGNED_FILES,
    InstallError,
    Source,
    check_git_ref,
    check_staged,
    copy_tree,
    fetched,
    file_hashes,
    registry_error,
    registry_listing,
    registry_location,
    registry_root,
    vouched,
)
from engine.process import data_disks

LOCK_VERSION = 1


# ---- lockfile ----

class Lockfile:
    """$LIBREFANG_HOME/plugins.lock: JSON {"version", "plugins": {name: {source, version, files, installed_at}}}."""

    def __init__(self, home: Home):
        self.path = home.lockfile

    @contextlib.contextmanager
    def locked(self) -> Iterator[dict]:
        """Exclusive read-modify-write; the file is replaced atomically when the block succeeds."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock.flock"), "a+") as guard:
            fcntl.flock(guard, fcntl.LOCK_EX)
            try:
                data = self.read()
                yield data
                self._write(data)
            finally:
                fcntl.flock(guard, fcntl.LOCK_UN)

    def read(self) -> dict:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            data = {}
        if not isinstance(data, dict) or not isinstance(data.get("plugins"), dict):
            data = {"version": LOCK_VERSION, "plugins": {}}
        return data

    def entry(self, name: str) -> dict | None:
        return self.read()["plugins"].get(name)

    def _write(self, data: dict) -> None:
        data["version"] = LOCK_VERSION
        tmp = self.path.with_name(self.path.name + f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, self.path)


def local_changes(plugin_dir: Path, recorded: dict[str, str]) -> dict[str, list[str]]:
    """Files edited, added or removed since install (empty lists: untouched)."""
    now = file_hashes(plugin_dir)
    return {
        "modified": sorted(p for p in recorded if p in now and now[p] != recorded[p]),
        "removed": sorted(p for p in recorded if p not in now),
        "added": sorted(p for p in now if p not in recorded),
    }


# ---- the operations ----

def _stage(home: Home, src: Path, name: str | None, provenance: dict) -> tuple[Path, Path, str, list[str]]:
    """Copy src into a staging dir named after the plugin and validate it there (manifest + [integrity], and for a
    signed registry every file against its index: the provenance's SIGNED_FILES, taken out of it here)."""
    home.plugins_dir.mkdir(parents=True, exist_ok=True)
    staging_root = Path(tempfile.mkdtemp(prefix=".staging-", dir=home.plugins_dir))
    try:
        try:
            manifest, _ = parse_manifest_text((src / "plugin.toml").read_text(encoding="utf-8"))
        except ManifestError as exc:
            raise InstallError("invalid_manifest", f"plugin.toml is invalid: {exc}", 400,
                               [f.to_dict() for f in exc.findings]) from exc
        except (OSError, UnicodeDecodeError) as exc:
            raise InstallError("invalid_manifest", f"cannot read plugin.toml: {exc}") from exc
        pname = manifest.name
        if name and name != pname:
            raise InstallError("name_mismatch", f"plugin.toml names the plugin {pname!r}, expected {name!r}")
        staged = staging_root / pname
        skipped = copy_tree(src, staged)
        check_staged(provenance.pop(SIGNED_FILES, None), pname, staged)
        try:
            load_plugin(staged, check_integrity=True)
        except ManifestError as exc:
            # the staging dir has no siblings: a dependency counts as present when it is installed in this home
            missing = [d for d in manifest.plugin_depends
                       if not (NAME_RE.match(d) and (home.plugin_dir(d) / "plugin.toml").is_file())]
            errors = [f for f in exc.findings if f.severity == "error" and
                      (f.id != "manifest.depends_missing" or any(repr(d) in f.message for d in missing))]
            if errors:
                code = "integrity_failed" if any(f.id.startswith("integrity") for f in errors) else "invalid_manifest"
                raise InstallError(code, "the plugin cannot be installed: " + "; ".join(f.message for f in errors),
                                   400, [f.to_dict() for f in exc.findings]) from exc
        return staging_root, staged, pname, skipped
    except BaseException:
        shutil.rmtree(staging_root, ignore_errors=True)
        raise


def install(home: Home, source: Source, default_registry: str | None = None,
            registries: Sequence[R.RegistryConfig] = ()) -> dict:
    """Fetch, validate and install a new plugin; records it in the lockfile. Raises InstallError."""
    with fetched(source, default_registry, registries) as (src, provenance):
        return _install_fetched(home, source, src, provenance)


def _case_twin(home: Home, name: str) -> str | None:
    """An installed plugin whose directory name differs from `name` only by case (as the dashboard's create form
    refuses them too)."""
    folded = name.casefold()
    try:
        entries = [p.name for p in home.plugins_dir.iterdir()]
    except FileNotFoundError:
        return None
    return next((n for n in entries if n != name and n.casefold() == folded), None)


def _install_fetched(home: Home, source: Source, src: Path, provenance: dict) -> dict:
    staging_root, staged, name, skipped = _stage(home, src, source.name, provenance)
    try:
        target = home.plugin_dir(name)
        lock = Lockfile(home)
        with lock.locked() as data:
            if target.exists():
                raise InstallError("already_installed", f"plugin {name!r} is already installed", 409)
            twin = _case_twin(home, name)
            if twin is not None:
                raise InstallError("already_installed", f"plugin {twin!r} is already installed (names differing "
                                   "only by case are one plugin to an operator)", 409)
            os.replace(staged, target)
            files = file_hashes(target)
            version = load_plugin(target, check_integrity=False).manifest.version
            data["plugins"][name] = {"source": source.to_dict(), "provenance": provenance, "version": version,
                                     "installed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                     "files": files}
    finally:
        shutil.rmtree(staging_root, ignore_errors=True)
    return {"installed": True, "name": name, "version": version, "path": str(target), "files": len(files),
            "skipped_symlinks": skipped, "restart_required": False}


def update(home: Home, name: str, force: bool = False, default_registry: str | None = None,
           registries: Sequence[R.RegistryConfig] = ()) -> dict:
    """Re-fetch an installed plugin from its recorded source. Refuses locally edited files unless force."""
    lock = Lockfile(home)
    entry = lock.entry(name)
    target = home.plugin_dir(name)
    if not (target / "plugin.toml").exists():
        raise InstallError("not_found", f"plugin {name!r} is not installed", 404)
    if entry is None:
        raise InstallError("not_tracked", f"plugin {name!r} was not installed from a source (no lockfile entry); "
                                          "nothing to update from", 409)
    changes = local_changes(target, entry.get("files") or {})
    if any(changes.values()) and not force:
        raise InstallError("locally_modified", f"plugin {name!r} has local edits; update with force to overwrite them",
                           409, changes)
    source = Source(**{k: v for k, v in entry["source"].items() if k in Source.__dataclass_fields__})
    with fetched(source, default_registry, registries) as (src, provenance):
        staging_root, staged, new_name, skipped = _stage(home, src, name, provenance)
    try:
        with lock.locked() as data:
            disabled = (target / ".disabled").exists()
            old = target.with_name(f".old-{name}-{os.getpid()}")
            os.replace(target, old)
            try:
                os.replace(staged, target)
            except OSError:
                os.replace(old, target)
                raise
            shutil.rmtree(old, ignore_errors=True)
            if disabled:
                (target / ".disabled").touch()
            files = file_hashes(target)
            version = load_plugin(target, check_integrity=False).manifest.version
            previous = entry.get("version")
            data["plugins"][name] = {**entry, "provenance": provenance, "version": version, "files": files,
                                     "updated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    finally:
        shutil.rmtree(staging_root, ignore_errors=True)
    return {"updated": True, "name": name, "previous_version": previous, "version": version, "path": str(target),
            "overwrote_local_changes": changes if any(changes.values()) else None, "skipped_symlinks": skipped}


def uninstall(home: Home, name: str) -> dict:
    if not NAME_RE.match(name or ""):
        raise InstallError("invalid_name", f"plugin name {name!r} is not allowed")
    target = home.plugin_dir(name)
    if not (target / "plugin.toml").is_file() or target.is_symlink():
        raise InstallError("not_found", f"plugin {name!r} is not installed", 404)
    lock = Lockfile(home)
    with lock.locked() as data:
        trash = target.with_name(f".removing-{name}-{os.getpid()}")
        os.replace(target, trash)
        shutil.rmtree(trash, ignore_errors=True)
        had_entry = data["plugins"].pop(name, None) is not None
    result = {"removed": True, "name": name, "was_locked": had_entry, "data_image_removed": False}
    try:  # its data directory's own filesystem, and what it held (engine/process/data_disks.py)
        result["data_image_removed"] = data_disks.remove(home.data_dir(name))
    except (OSError, data_disks.DiskError) as exc:
        result["data_image_error"] = str(exc)
    return result


# ---- a plugin and the plugins it depends on, from one registry ----

def dependency_order(name: str, depends_of) -> list[str]:
    """Depth-first topological order (dependencies first, `name` last) over `depends_of(n) -> [names]`.
    Raises InstallError on a cycle or an unknown plugin (depends_of returns None)."""
    order: list[str] = []
    state: dict[str, str] = {}

    def visit(n: str, path: list[str]) -> None:
        if state.get(n) == "done":
            return
        if state.get(n) == "visiting":
            raise InstallError("dependency_cycle", "plugin dependencies form a cycle: " + " -> ".join([*path, n]))
        deps = depends_of(n)
        if deps is None:
            raise InstallError("dependency_not_found", f"{' -> '.join([*path, n])}: plugin {n!r} is not in the "
                                                       "registry", 404 if not path else 400)
        state[n] = "visiting"
        for d in deps:
            if not isinstance(d, str) or not NAME_RE.match(d):
                raise InstallError("invalid_name", f"plugin {n!r} depends on an invalid name {d!r}")
            visit(d, [*path, n])
        state[n] = "done"
        order.append(n)

    visit(name, [])
    return order


def install_with_dependencies(home: Home, name: str, registry: str | None, default_registry: str | None,
                              registries: Sequence[R.RegistryConfig] = (), ref: str | None = None) -> dict:
    """Install `name` and, first, every plugin it depends on (`plugin_depends`, transitively) from the same registry,
    fetched once. Plugins already installed are left as they are. Stops at the first failure (what was installed
    before it stays installed and is reported)."""
    if not NAME_RE.match(name or ""):
        raise InstallError("invalid_name", f"plugin name {name!r} is not allowed")
    loc = registry_location(registry, default_registry, registries)
    cfg = R.config_for(registry or default_registry or "", list(registries))
    ref = check_git_ref(ref)
    with registry_root(loc, ref) as (root, prov):
        listing = registry_listing(root, cfg) if (cfg.public_key or cfg.signatures_required) else None

        def depends_of(n: str) -> list[str] | None:
            toml = root / "plugins" / n / "plugin.toml"
            if (root / "plugins" / n).is_symlink() or not toml.is_file():
                return None
            try:
                return list(parse_manifest_text(toml.read_text(encoding="utf-8"))[0].plugin_depends)
            except (ManifestError, OSError, UnicodeDecodeError) as exc:
                raise InstallError("invalid_manifest", f"plugins/{n}/plugin.toml is invalid: {exc}") from exc

        order = dependency_order(name, depends_of)
        installed, present = [], []
        for n in order:
            if (home.plugin_dir(n) / "plugin.toml").exists():
                present.append(n)
                continue
            pdir = root / "plugins" / n
            provenance = dict(prov)
            if listing is not None:
                provenance.update(vouched(listing, n, pdir, cfg))
            source = Source("registry", registry=registry, name=n, ref=ref)
            _install_fetched(home, source, pdir, provenance)
            installed.append(n)
    return {"name": name, "order": order, "installed": installed, "already_installed": present,
            "count": len(installed), "message": f"installed {len(installed)} plugin(s): {', '.join(installed)}"
            if installed else "everything was already installed"}


# ---- export and update-check ----

EXPORT_LOCK_NAME = "librefang-lock.json"


def export_archive(home: Home, name: str) -> bytes:
    """A gzip tarball of the plugin directory (`<name>/…`, no symlinks, no .git or caches) plus
    `<name>/librefang-lock.json`: its plugins.lock entry (source, version, per-file sha256), or null if untracked."""
    import io
    import tarfile

    target = home.plugin_dir(name)
    if not NAME_RE.match(name or "") or target.is_symlink() or not (target / "plugin.toml").is_file():
        raise InstallError("not_found", f"plugin {name!r} is not installed", 404)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for rel in sorted(file_hashes(target)):
            tar.add(target / rel, arcname=f"{name}/{rel}", recursive=False)
        lock = json.dumps({"name": name, "entry": Lockfile(home).entry(name)}, indent=2, sort_keys=True).encode()
        info = tarfile.TarInfo(f"{name}/{EXPORT_LOCK_NAME}")
        info.size = len(lock)
        info.mtime = int(time.time())
        info.mode = 0o644
        tar.addfile(info, io.BytesIO(lock))
    return buf.getvalue()


def update_check(home: Home, name: str, default_registry: str | None = None,
                 registries: Sequence[R.RegistryConfig] = ()) -> dict:
    """Fetch the plugin's recorded source and compare versions (and, for git, commits); nothing is changed."""
    entry = Lockfile(home).entry(name)
    target = home.plugin_dir(name)
    if not (target / "plugin.toml").is_file():
        raise InstallError("not_found", f"plugin {name!r} is not installed", 404)
    try:
        installed_version = load_plugin(target, check_integrity=False).manifest.version
    except ManifestError as exc:
        raise InstallError("invalid_manifest", f"the installed plugin.toml of {name!r} is invalid, so there is no "
                                               f"version to compare: {exc}", 409,
                           [f.to_dict() for f in exc.findings]) from exc
    if entry is None:
        raise InstallError("not_tracked", f"plugin {name!r} was not installed from a source (no lockfile entry); "
                                          "there is nothing to compare with", 409)
    source = Source(**{k: v for k, v in entry["source"].items() if k in Source.__dataclass_fields__})
    with fetched(source, default_registry, registries) as (src, provenance):
        try:
            available = parse_manifest_text((src / "plugin.toml").read_text(encoding="utf-8"))[0].version
        except (ManifestError, OSError, UnicodeDecodeError) as exc:
            raise InstallError("invalid_manifest", f"the source's plugin.toml is invalid: {exc}", 502) from exc
        upstream_files = file_hashes(src)
    installed_commit = (entry.get("provenance") or {}).get("commit")
    changed = upstream_files != entry.get("files")
    return {"plugin": name, "installed_version": installed_version, "available_version": available,
            "update_available": R.is_newer(available, installed_version) or (available == installed_version and changed),
            "newer_version": R.is_newer(available, installed_version), "source_changed": changed,
            "installed_commit": installed_commit, "available_commit": provenance.get("commit"),
            "source": source.to_dict()}
