"""Reads of plugin permissions (engine/plugins/permissions.py): which manifest versions an owner approved, as the
engine asks (`DbApprovals`), and what a plugin asks, what changed since its last approved version and what its
hooks get now, as the dashboard, the API and the CLI show it (`permissions`)."""

from __future__ import annotations

import difflib
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError

from engine import findings as F
from engine.plugins.loader import manifest_path, manifest_sha256
from engine.plugins.manifest import ManifestError, parse_manifest_text
from engine.plugins.permissions import PermissionPolicy, Request, changes, requested
from plugins_app.home import catalog as plugin_catalog
from plugins_app.home import config_cache, home
from plugins_app.models import PluginApproval

log = logging.getLogger("librefang.permissions")


class DbApprovals:
    """The engine's `Approvals` from the database. An approved version stays approved (kept in memory for good);
    a version not approved is asked about again after NEGATIVE_TTL_SECS, so an owner's approval reaches every
    worker within that. The database unreachable counts as not approved (the defaults, never more)."""

    NEGATIVE_TTL_SECS = 1.0

    def __init__(self) -> None:
        self._approved: set[tuple[str, str]] = set()
        self._refused: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()

    def approved(self, plugin: str, manifest_sha256: str) -> bool:
        key = (plugin, manifest_sha256)
        now = time.monotonic()
        with self._lock:
            if key in self._approved:
                return True
            if now - self._refused.get(key, -1e9) < self.NEGATIVE_TTL_SECS:
                return False
        try:
            found = PluginApproval.objects.filter(plugin=plugin, manifest_sha256=manifest_sha256).exists()
        except DatabaseError:
            log.warning("approvals unreachable: %s runs with the defaults", plugin, exc_info=True)
            found = False
        with self._lock:
            if found:
                self._approved.add(key)
            else:
                if len(self._refused) > 4096:
                    self._refused.clear()
                self._refused[key] = now
        return found


def latest_approval(name: str) -> PluginApproval | None:
    return PluginApproval.objects.filter(plugin=name).first()


@dataclass(frozen=True)
class ManifestVersion:
    """One plugin.toml text of a plugin: its hash (what an approval names) and what it asks."""

    text: str
    sha256: str
    request: Request | None  # None: it does not parse
    error: str = ""


def on_disk(name: str) -> ManifestVersion:
    try:
        text = manifest_path(home().plugin_dir(name)).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return ManifestVersion("", "", None, f"plugin.toml cannot be read: {exc}")
    return version(name, text)


def version(name: str, text: str) -> ManifestVersion:
    """One plugin.toml text of plugin `name`: its hash and what it asks."""
    try:
        manifest, _ = parse_manifest_text(text, expected_name=name)
    except ManifestError as exc:
        return ManifestVersion(text, manifest_sha256(text), None, f"plugin.toml is invalid: {exc}")
    return ManifestVersion(text, manifest_sha256(text), requested(manifest))


def permissions(name: str) -> dict[str, Any]:
    """What plugin `name` asks beyond the defaults (its plugin.toml on disk), whether that version is approved,
    what changed since the last approved version, and what its hooks get now (the serving version, within the
    ceilings). The caller checked that the plugin is installed."""
    disk = on_disk(name)
    last = latest_approval(name)
    last_request = Request.from_dict(last.permissions) if last is not None else None
    approved = bool(disk.sha256) and PluginApproval.objects.filter(plugin=name, manifest_sha256=disk.sha256).exists()
    out: dict[str, Any] = {
        "plugin": name, "manifest_sha256": disk.sha256, "valid": disk.request is not None, "error": disk.error,
        "asks": disk.request.asks() if disk.request is not None else [],
        "asks_nothing": disk.request is not None and disk.request.empty,
        "approved": approved,
        "needs_approval": disk.request is not None and not disk.request.empty and not approved,
        "last_approved": _approval_dict(last),
        "changes": changes(last_request, disk.request) if disk.request is not None else {"added": [], "removed": []},
        "manifest_diff": _diff(last.manifest if last is not None else "", disk.text) if not approved else "",
        "ceilings": config_cache().get().limits.model_dump(),
    }
    out["effective"] = effective(name)
    return out


def effective(name: str) -> dict[str, Any] | None:
    """What the serving version's hooks get now (None: it cannot be loaded)."""
    entry = plugin_catalog().get(name)
    if entry.plugin is None:
        return None
    policy = PermissionPolicy.of(config_cache().get(), DbApprovals())
    g = policy.grant(entry.plugin)
    return {"in_force": g.in_force, "manifest_sha256": entry.plugin.manifest_sha256, "network": g.network,
            "filesystem": g.filesystem, "env_vars": sorted(g.env_vars), "secrets": list(g.secrets),
            "wasm_capabilities": list(g.wasm_capabilities), "max_processes": g.max_processes,
            "max_memory_mb": g.max_memory_mb, "max_cpu_secs": g.max_cpu_secs,
            "hook_timeout_secs": g.hook_timeout_secs, "max_disk_mb": g.max_disk_mb, "warnings": list(g.warnings)}


def unapproved_finding(name: str) -> dict[str, Any] | None:
    """The doctor's finding for a plugin whose serving version asks for more than the defaults without approval."""
    entry = plugin_catalog().get(name)
    plugin = entry.plugin
    if plugin is None or plugin.requested.empty or DbApprovals().approved(name, plugin.manifest_sha256):
        return None
    asks = ", ".join(a["label"] for a in plugin.requested.asks())
    return F.warning("permissions.unapproved", f"this version of plugin.toml is not approved: its hooks run with the "
                     f"defaults instead of: {asks}", f"Review it and approve it: librefang plugin approve {name}, "
                     "or the plugin page's Approve button.").to_dict()


def _approval_dict(row: PluginApproval | None) -> dict[str, Any] | None:
    if row is None:
        return None
    return {"manifest_sha256": row.manifest_sha256, "approved_by": row.approved_by, "how": row.how,
            "approved_at": row.approved_at.isoformat(), "asks": Request.from_dict(row.permissions).asks()}


def _diff(before: str, after: str) -> str:
    lines = difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                 "plugin.toml (last approved)" if before else "(nothing approved yet)",
                                 "plugin.toml (on disk)")
    return "".join(lines)
