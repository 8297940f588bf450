"""What a plugin asks beyond the defaults and the owner's approval of it (docs/security.md, "Permissions and
approvals"): `GET /api/plugins/<name>/permissions` (viewer) shows the asks of the plugin.toml on disk, whether that
version is approved, what changed since the last approved one and what its hooks get now;
`POST /api/plugins/<name>/permissions/approve` (owner) approves it."""

from __future__ import annotations

from plugins_app.api.errors import ApiError, json_body, json_response
from plugins_app.api.plugins import E, PluginPath
from plugins_app.api.security import ActionRouter, actor
from plugins_app.schemas.permissions import ApproveIn, PermissionsOut
from plugins_app.selectors import permissions as perm_selectors
from plugins_app.selectors import plugins as plugin_selectors
from plugins_app.services import permissions as perm_service

router = ActionRouter(tags=["plugins"])


@router.get("/{name}/permissions", response={200: PermissionsOut, **E},
            operation_id="plugins_permissions")
def permissions(request, name: str = PluginPath):
    """The asks of the plugin.toml on disk (network, filesystem, service variables, secrets, wasm host calls, limits
    above the defaults), whether this version is approved, what changed since the last approved version (asks and a
    diff of plugin.toml), the operator's ceilings, and what the serving version's hooks get now."""
    if not plugin_selectors.is_installed(name):
        raise ApiError(404, "not_found", f"plugin {name!r} is not installed")
    return json_response(perm_selectors.permissions(name))


@router.post("/{name}/permissions/approve", response={200: PermissionsOut, **E},
             operation_id="plugins_approve",
             openapi_extra={"requestBody": {"required": False, "content": {"application/json": {
                 "schema": ApproveIn.model_json_schema()}}}})
def approve(request, name: str = PluginPath):
    """Approve what the plugin.toml on disk asks: from the next call its hooks get it, within the ceilings of
    config.toml. 409 `manifest_changed` when `manifest_sha256` names another version than the one on disk."""
    body = json_body(request, ApproveIn)
    return json_response(perm_service.approve(name, actor(request), expected_sha256=body.manifest_sha256))
