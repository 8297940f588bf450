"""A plugin directory read and checked: plugin.toml parsed (engine/plugins/manifest.py), hook paths kept inside the
directory, dependencies installed, [integrity] verified; and `read_manifest`, the one cached plugin.toml reader for
code that has a plugin directory but no catalog entry at hand."""

from __future__ import annotations

import functools
import hashlib
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from engine import findings as F
from engine.filecache import FileCache, file_stamp, real_path
from engine.findings import Finding
from engine.plugins.manifest import NAME_RE, Manifest, ManifestError, parse_manifest_text
from engine.plugins.permissions import Request, requested


@dataclass
class LoadedPlugin:
    """A parsed plugin directory. `findings` carries warnings; a plugin with errors never becomes a LoadedPlugin."""

    dir: Path
    manifest: Manifest
    findings: list[Finding] = field(default_factory=list)
    fingerprint: tuple = ()
    manifest_sha256: str = ""  # of the plugin.toml text this was parsed from: what an owner's approval names

    @property
    def name(self) -> str:
        return self.manifest.name

    @functools.cached_property
    def requested(self) -> Request:
        """What this manifest version asks beyond the defaults (engine/plugins/permissions.py)."""
        return requested(self.manifest)


def directory_findings(plugin_dir: Path, manifest: Manifest) -> list[Finding]:
    """Load-time checks against the directory: hook paths stay inside it, dependencies are installed.

    (Missing hook files, exec bits, required binaries and metadata are lint's findings: engine/plugins/lint.py.)
    """
    out: list[Finding] = []
    root = Path(real_path(plugin_dir))
    for hook, script in manifest.hooks.declared_hooks().items():
        rel = Path(script)
        if rel.is_absolute() or ".." in rel.parts:
            out.append(F.error("manifest.hook_path_traversal", f"[hooks] {hook} = {script!r} leaves the plugin "
                               "directory", "Hook paths are relative to the plugin directory, without '..'."))
            continue
        target = Path(real_path(root / rel))
        if not target.is_relative_to(root):
            out.append(F.error("manifest.hook_path_escape", f"[hooks] {hook} = {script!r} is a symlink that leaves "
                               "the plugin directory", "Copy the script into the plugin instead of linking it."))
    for dep in manifest.plugin_depends:
        if not NAME_RE.match(dep) or not (plugin_dir.parent / dep / "plugin.toml").is_file():
            out.append(F.error("manifest.depends_missing", f"plugin_depends: {dep!r} is not installed",
                               f"Install the plugin {dep!r} first."))
    return out


def manifest_path(plugin_dir: Path) -> Path:
    return plugin_dir / "plugin.toml"


def _parsed_or_none(text: str) -> Manifest | None:
    try:
        return parse_manifest_text(text)[0]
    except ManifestError:
        return None


_readers: dict[Path, FileCache[Manifest | None]] = {}
_readers_lock = threading.Lock()


def read_manifest(plugin_dir: Path) -> Manifest | None:
    """plugin.toml of `plugin_dir`, parsed once per change of the file (None when it is missing or invalid): for code
    that has a plugin directory but no catalog entry at hand."""
    path = manifest_path(plugin_dir)
    with _readers_lock:
        reader = _readers.get(path)
        if reader is None:
            reader = _readers[path] = FileCache(path, _parsed_or_none, None, "plugin.toml")
    return reader.get()


def fingerprint(plugin_dir: Path) -> tuple:
    """Changes whenever plugin.toml changes on disk (cheap: one stat)."""
    return file_stamp(manifest_path(plugin_dir))


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
    found += directory_findings(plugin_dir, manifest)
    if check_integrity:
        found += verify_integrity(plugin_dir, manifest)
    if F.has_errors(found):
        raise ManifestError(found)
    return LoadedPlugin(plugin_dir, manifest, found, fingerprint(plugin_dir), manifest_sha256(text))


def manifest_sha256(text: str) -> str:
    """The hash an approval names: sha256 of plugin.toml's UTF-8 text, exactly as it was parsed."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def verify_integrity(plugin_dir: Path, manifest: Manifest) -> list[Finding]:
    out = []
    for rel, expected in manifest.integrity.items():
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            out.append(F.error("integrity.path_invalid", f"[integrity] path {rel!r} leaves the plugin directory",
                               "Integrity paths are relative to the plugin directory."))
            continue
        target = (plugin_dir / rel)
        try:
            digest = file_sha256(target)
        except OSError as exc:
            out.append(F.error("integrity.unreadable", f"[integrity] file {rel} cannot be read: {exc}",
                               "Restore the file or re-sign the plugin."))
            continue
        if digest != expected.lower():
            out.append(F.error("integrity.mismatch", f"[integrity] sha256 of {rel} does not match",
                               "The file changed after signing: restore it, or re-sign if the change is yours."))
    return out


_digests: dict[str, tuple[tuple, str]] = {}
_digests_lock = threading.Lock()


def file_sha256(path: Path) -> str:
    """sha256 of a file, re-hashed whenever its stat changes. ctime is part of the key: any write, rename or
    utime() moves it and user space cannot set it back, so a tampered file is always re-hashed."""
    st = os.stat(path)
    key = (st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    name = str(path)
    with _digests_lock:
        hit = _digests.get(name)
    if hit is not None and hit[0] == key:
        return hit[1]
    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    with _digests_lock:
        if len(_digests) > 4096:
            _digests.clear()
        _digests[name] = (key, digest)
    return digest
