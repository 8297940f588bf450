"""Approving what a plugin asks beyond the defaults (engine/plugins/permissions.py; docs/security.md, "Permissions
and approvals").

An approval names one plugin.toml version (its sha256) of one plugin, is written to the database (where no hook can
write) and to the audit trail. It is given:

- explicitly by an owner: `approve` (the dashboard's Approve button, `POST /api/plugins/<name>/permissions/approve`,
  `librefang plugin approve <name>`), optionally for the exact version the owner looked at (`expected_sha256`);
- at once by an owner's own act through this service (`after_owner_act`): scaffold and install approve the new
  plugin's asks (the answer lists them); an edit of plugin.toml through the API or the dashboard approves the result
  when the version it edited was in force; reload, update and any edit approve a version that asks nothing the last
  approved one did not grant (an update that adds no permission, like a browser extension's). Anything else waits
  for an explicit approval, and the answer says what it asks.
"""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError

from engine.plugins.permissions import Request, covered
from plugins_app import events
from plugins_app.errors import PluginError
from plugins_app.home import catalog as plugin_catalog
from plugins_app.models import PluginApproval
from plugins_app.selectors import permissions as perm_selectors
from plugins_app.services import audit

# Owner acts that approve the resulting version outright: the owner created or chose this plugin.
APPROVING_ACTS = ("scaffold", "install")


def approve(name: str, actor: str, expected_sha256: str | None = None, how: str = "approve") -> dict[str, Any]:
    """Approve the plugin.toml now on disk. 409 when it is not the version `expected_sha256` names (it changed since
    the owner looked), 400 when it does not parse."""
    if not plugin_catalog().exists(name):
        raise PluginError("not_found", f"plugin {name!r} is not installed", 404)
    disk = perm_selectors.on_disk(name)
    if disk.request is None:
        raise PluginError("invalid_manifest", f"{name}: {disk.error}; nothing to approve", 400)
    if expected_sha256 and expected_sha256 != disk.sha256:
        raise PluginError("manifest_changed", f"plugin.toml of {name!r} changed since it was shown (now sha256 "
                                              f"{disk.sha256[:12]}…): look at it again before approving", 409,
                          {"manifest_sha256": disk.sha256})
    _record(name, disk, actor, how)
    return perm_selectors.permissions(name)


def _record(name: str, disk: perm_selectors.ManifestVersion, actor: str, how: str) -> None:
    assert disk.request is not None
    try:
        _row, created = PluginApproval.objects.get_or_create(
            plugin=name, manifest_sha256=disk.sha256,
            defaults={"permissions": disk.request.to_dict(), "manifest": disk.text, "approved_by": actor, "how": how})
    except IntegrityError:  # approved by someone else at the same moment
        created = False
    if created:
        audit.record(actor, "plugin.approve", name, details={"manifest_sha256": disk.sha256, "how": how,
                                                             "asks": [a["label"] for a in disk.request.asks()]})
        events.plugin_changed(name, "approved")


def in_force(name: str, text: str) -> bool:
    """Whether plugin.toml `text` of plugin `name` runs with what it asks (it asks nothing, or it is approved)."""
    version = perm_selectors.version(name, text)
    if version.request is None:
        return False
    return version.request.empty or PluginApproval.objects.filter(plugin=name,
                                                                  manifest_sha256=version.sha256).exists()


def after_owner_act(name: str, actor: str, how: str, text: str | None = None,
                    edited_in_force: bool = False) -> dict[str, Any]:
    """After scaffold, install, update, reload or an edit by an owner: approve the new version when the act says
    so (module docstring), and tell the caller what it asks and whether it is in force. `text`: the plugin.toml the
    act wrote (an edit approves exactly what it wrote, whatever is on disk by then); else the one on disk."""
    disk = perm_selectors.on_disk(name) if text is None else perm_selectors.version(name, text)
    if disk.request is None:
        return {"asks": [], "in_force": False, "error": disk.error}
    approved = disk.request.empty or PluginApproval.objects.filter(
        plugin=name, manifest_sha256=disk.sha256).exists()
    if not approved and _approves(name, disk.request, how, edited_in_force):
        _record(name, disk, actor, how)
        approved = True
    out: dict[str, Any] = {"asks": disk.request.asks(), "in_force": approved, "manifest_sha256": disk.sha256}
    if not approved:
        out["message"] = (f"this version of {name} asks for more than its last approved one; until an owner "
                          f"approves it, its hooks run with the defaults (librefang plugin approve {name})")
    return out


def _approves(name: str, request: Request, how: str, edited_in_force: bool) -> bool:
    if how in APPROVING_ACTS or (how == "edit" and edited_in_force):
        return True
    last = perm_selectors.latest_approval(name)
    return last is not None and covered(request, Request.from_dict(last.permissions))
