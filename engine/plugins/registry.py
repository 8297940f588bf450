"""Plugin registries: where they are, what they offer (index.json or the plugins/ listing) and whether to trust it.

A registry is a directory or a git repository holding `plugins/<name>/plugin.toml`, optionally with a flat
`index.json` at its root (`{"plugins": [{"name", "version", "description", "plugin_depends", "files"?}]}` or a bare
list). An operator may pin an Ed25519 public key per registry (`public_key`, base64 of the 32 raw bytes, in
`[plugins] plugin_registries` of config.toml): the index must then come with `index.json.sig` (base64 signature of
index.json's exact bytes), and a plugin installed from it must be listed in it (and match its `files` hashes, when
the entry has them). `require_signature = false` keeps a key but accepts an unsigned index; a bad signature is
always refused.

Pure Python; git runs through engine/plugins/sources.py.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import tomllib
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from engine.plugins.manifest import NAME_RE

INDEX_FILE = "index.json"
SIGNATURE_FILE = "index.json.sig"
MAX_INDEX_BYTES = 8 * 1024 * 1024


class RegistryError(Exception):
    def __init__(self, code: str, message: str, status: int = 400):
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status


@dataclass(frozen=True)
class RegistryConfig:
    location: str  # a directory, a git URL, or GitHub's owner/repo
    name: str = ""
    public_key: str | None = None
    require_signature: bool | None = None  # None: required exactly when a key is configured

    @property
    def signatures_required(self) -> bool:
        return bool(self.public_key) if self.require_signature is None else self.require_signature

    def to_dict(self) -> dict:
        return {"name": self.name or self.location, "location": self.location, "public_key": self.public_key,
                "signatures_required": self.signatures_required}


def parse_registries(plugins_table: object) -> list[RegistryConfig]:
    """`[plugins] registry = "..."` and `plugin_registries = ["owner/repo" | {name, github_repo|url|path,
    public_key?, require_signature?}]`, first the default; unusable entries are skipped."""
    if not isinstance(plugins_table, dict):
        return []
    out: list[RegistryConfig] = []
    default = plugins_table.get("registry") or plugins_table.get("default_registry")
    if isinstance(default, str) and default.strip():
        out.append(RegistryConfig(default, "default", _str(plugins_table.get("registry_public_key")),
                                  _bool(plugins_table.get("registry_require_signature"))))
    regs = plugins_table.get("plugin_registries")
    for item in regs if isinstance(regs, list) else []:
        if isinstance(item, str) and item.strip():
            out.append(RegistryConfig(item, item))
        elif isinstance(item, dict):
            loc = item.get("github_repo") or item.get("url") or item.get("path")
            if isinstance(loc, str) and loc.strip():
                out.append(RegistryConfig(loc, _str(item.get("name")) or loc, _str(item.get("public_key")),
                                          _bool(item.get("require_signature"))))
    seen: set[str] = set()
    unique = []
    for r in out:
        if r.location not in seen:
            seen.add(r.location)
            unique.append(r)
    return unique


def _str(v: object) -> str | None:
    return v.strip() if isinstance(v, str) and v.strip() else None


def _bool(v: object) -> bool | None:
    return v if isinstance(v, bool) else None


_GITHUB_SHORT = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
_SCP_LIKE = re.compile(r"^(?:[^@/]+@)?([^:/]+):(?!//)(.+)$")  # git@host:owner/repo.git


def normalise_location(location: str) -> str:
    """One spelling per registry, so its key applies however the operator or a caller writes it: a local directory
    by its real path (`/reg/`, `/x/../reg`, a symlink: the same), a remote one as host/path whatever its scheme,
    user, default port, trailing slash, `.git` or the case of its host (and of the path on github.com)."""
    loc = location.strip()
    if loc.startswith("file://"):
        loc = urllib.parse.unquote(loc[len("file://"):]) or "/"
    if loc.startswith(("/", "~")):
        return os.path.realpath(os.path.expanduser(loc))
    if _GITHUB_SHORT.match(loc) and not Path(loc).exists():
        loc = f"https://github.com/{loc}"
    scp = _SCP_LIKE.match(loc)
    if scp and "://" not in loc:
        loc = f"ssh://{scp.group(1)}/{scp.group(2)}"
    parts = urllib.parse.urlsplit(loc)
    host = (parts.hostname or "").lower().rstrip(".")
    port = f":{parts.port}" if parts.port and parts.port not in (22, 80, 443, 9418) else ""
    path = re.sub(r"/+", "/", parts.path).rstrip("/").removesuffix(".git").rstrip("/")
    if host in ("github.com", "www.github.com"):
        host, path = "github.com", path.lower()
    return f"{host}{port}{path}" if host else loc


def config_for(location: str, registries: list[RegistryConfig]) -> RegistryConfig:
    """The operator's settings for a registry named by its configured name or any spelling of its location (a
    registry nobody configured gets no key). When it is configured more than once, the entry with a key wins."""
    wanted = normalise_location(location) if location else ""
    found = [r for r in registries if r.name == location or (wanted and normalise_location(r.location) == wanted)]
    keyed = [r for r in found if r.public_key or r.signatures_required]
    return (keyed or found or [RegistryConfig(location)])[0]


# ---- signatures ----

def load_public_key(text: str):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        raw = base64.b64decode(text.strip(), validate=True)
        return Ed25519PublicKey.from_public_bytes(raw)
    except (binascii.Error, ValueError) as exc:
        raise RegistryError("registry_key_invalid", "the registry's public_key must be the base64 of a 32-byte "
                                                    f"Ed25519 public key ({exc})") from exc


def verify_index(index_bytes: bytes, signature_text: bytes | None, cfg: RegistryConfig) -> bool:
    """True when the index is signed by the configured key; False when unsigned and no signature is required.
    Raises RegistryError for a bad signature, or a missing one the operator asked for."""
    from cryptography.exceptions import InvalidSignature

    if cfg.signatures_required and not cfg.public_key:
        raise RegistryError("registry_key_missing", f"registry {cfg.name or cfg.location} requires signatures but has "
                                                    "no public_key configured")
    if not cfg.public_key:
        return False
    if signature_text is None:
        if cfg.signatures_required:
            raise RegistryError("registry_unsigned", f"registry {cfg.name or cfg.location} must sign its {INDEX_FILE} "
                                                     f"({SIGNATURE_FILE} is missing)")
        return False
    key = load_public_key(cfg.public_key)
    try:
        signature = base64.b64decode(signature_text.strip(), validate=True)
        key.verify(signature, index_bytes)
    except (binascii.Error, ValueError, InvalidSignature) as exc:
        raise RegistryError("registry_signature_invalid", f"the signature of {INDEX_FILE} in registry "
                                                          f"{cfg.name or cfg.location} does not verify") from exc
    return True


# ---- what a registry offers ----

@dataclass
class Listing:
    entries: list[dict]
    signed: bool
    source: str  # "index.json" | "plugins/"
    errors: list[str] = field(default_factory=list)

    def entry(self, name: str) -> dict | None:
        return next((e for e in self.entries if e.get("name") == name), None)


def read_listing(root: Path, cfg: RegistryConfig) -> Listing:
    """The registry's offer, from its (verified) index.json, else from its plugins/<name>/plugin.toml files."""
    index = root / INDEX_FILE
    if index.is_file() and not index.is_symlink():
        data = index.read_bytes()[:MAX_INDEX_BYTES + 1]
        if len(data) > MAX_INDEX_BYTES:
            raise RegistryError("registry_index_invalid", f"{INDEX_FILE} is larger than {MAX_INDEX_BYTES} bytes")
        sig = root / SIGNATURE_FILE
        signed = verify_index(data, sig.read_bytes() if sig.is_file() and not sig.is_symlink() else None, cfg)
        try:
            raw = json.loads(data)
        except ValueError as exc:
            raise RegistryError("registry_index_invalid", f"{INDEX_FILE} is not valid JSON: {exc}") from exc
        items = raw.get("plugins") if isinstance(raw, dict) else raw
        if not isinstance(items, list):
            raise RegistryError("registry_index_invalid", f"{INDEX_FILE} must be a list or {{\"plugins\": [...]}}")
        entries = [_entry(e) for e in items if isinstance(e, dict) and isinstance(e.get("name"), str)
                   and NAME_RE.match(e["name"])]
        return Listing(entries, signed, INDEX_FILE)
    if cfg.signatures_required:
        verify_index(b"", None, cfg)  # raises: the operator asked for a signed index and there is none
    entries, errors = [], []
    pdir = root / "plugins"
    for child in sorted(pdir.iterdir()) if pdir.is_dir() else []:
        toml = child / "plugin.toml"
        if child.is_symlink() or not NAME_RE.match(child.name) or not toml.is_file():
            continue
        try:
            m = tomllib.loads(toml.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            errors.append(f"{child.name}: {exc}")
            continue
        hooks = m.get("hooks") if isinstance(m.get("hooks"), dict) else {}
        entries.append(_entry({**m, "name": child.name,
                               "hooks": [h for h, v in hooks.items() if isinstance(v, str) and h in _HOOKS]}))
    return Listing(entries, False, "plugins/", errors)


_HOOKS = {"ingest", "after_turn", "assemble", "compact", "bootstrap", "prepare_subagent", "merge_subagent",
          "transform_tool_result", "on_event"}


def _entry(e: dict) -> dict:
    deps = e.get("plugin_depends") or e.get("needs") or []
    hooks = e.get("hooks") or []
    return {"name": e["name"], "version": str(e.get("version") or ""), "description": str(e.get("description") or ""),
            "author": str(e.get("author") or ""),
            "hooks": sorted(h for h in hooks if isinstance(h, str)) if isinstance(hooks, list) else [],
            "plugin_depends": [d for d in deps if isinstance(d, str)] if isinstance(deps, list) else [],
            "files": {k: v for k, v in e["files"].items() if isinstance(k, str) and isinstance(v, str)}
            if isinstance(e.get("files"), dict) else {}}


def check_membership(listing: Listing, name: str, files: dict[str, str], cfg: RegistryConfig) -> None:
    """A signed registry vouches only for what its index lists: the plugin must be there, and every one of its
    files (`files`: path -> sha256, as engine/plugins/sources.py file_hashes gives them) must be listed in its entry
    with that hash. A file the index does not list (added after signing) refuses the install, as does a listed one
    that is missing or differs."""
    if not listing.signed:
        return
    where = f"the signed {INDEX_FILE} of registry {cfg.name or cfg.location}"
    entry = listing.entry(name)
    if entry is None:
        raise RegistryError("registry_not_listed", f"plugin {name!r} is not in {where}")
    listed = {rel: digest.lower() for rel, digest in entry["files"].items()}
    unlisted = sorted(set(files) - set(listed))
    if unlisted:
        raise RegistryError("registry_file_unlisted", f"{', '.join(unlisted[:5])} of plugin {name!r} "
                                                      f"{'is' if len(unlisted) == 1 else 'are'} not listed in {where}")
    for rel, digest in listed.items():
        if rel not in files:
            raise RegistryError("registry_file_mismatch", f"{rel} is listed in the signed index but missing")
        if files[rel] != digest:
            raise RegistryError("registry_file_mismatch", f"{rel} does not match its sha256 in the signed index")


def search(listing: Listing, query: str, installed: dict[str, str]) -> list[dict]:
    """Entries whose name, description or author hold every word of the query (all entries for an empty query),
    with `installed` and `installed_version` for this home."""
    words = [w for w in re.split(r"\s+", query.lower().strip()) if w]
    out = []
    for e in listing.entries:
        hay = f"{e['name']} {e['description']} {e['author']}".lower()
        if all(w in hay for w in words):
            out.append({k: v for k, v in e.items() if k != "files"} | {
                "installed": e["name"] in installed, "installed_version": installed.get(e["name"])})
    return out


def version_key(version: str) -> tuple:
    """Compare "1.10.0" > "1.9.2"; non-numeric parts compare as text after numbers."""
    parts = re.split(r"[.+-]", version.strip().lstrip("v"))
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in parts if p)


def is_newer(candidate: str, installed: str) -> bool:
    if not candidate:
        return False
    return version_key(candidate) > version_key(installed or "0")
