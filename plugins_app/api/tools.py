"""WASM tool plugins (AgentZero ABI v2): list, execute (through a worker), install, package, enable/disable, remove.

The role of each route: plugins_app/auth.py ACTION_ROLES (`tools_*`).
"""

import json

from django.http import HttpRequest, HttpResponse

from plugins_app.api.contract import body_of
from plugins_app.api.errors import ApiError, json_response, parse_body
from plugins_app.api.security import ActionRouter, actor
from plugins_app.schemas import ErrorEnvelope, ToolExecuteIn, ToolRunOut
from plugins_app.selectors import tools as tool_selectors
from plugins_app.services import tools as tool_service

router = ActionRouter(tags=["tools"])
ERRORS = {400: ErrorEnvelope, 401: ErrorEnvelope, 403: ErrorEnvelope, 404: ErrorEnvelope, 409: ErrorEnvelope,
          413: ErrorEnvelope}


def _upload(request: HttpRequest, field: str) -> bytes | None:
    upload = request.FILES.get(field)
    return upload.read() if upload is not None else None


@router.get("", response={200: dict, **ERRORS}, operation_id="tools_list")
def list_tools(request):
    """Installed WASM tools (latest version of each) with state, capabilities, module name/schema and problems."""
    return json_response({"tools": tool_selectors.list_tools(), "policy": tool_selectors.policy_summary(),
                          "policy_error": tool_selectors.policy_error()})


@router.post("/install", response={201: dict, **ERRORS, 503: ErrorEnvelope, 504: ErrorEnvelope}, operation_id="tools_install")
async def install(request):
    """Install a tool package: the tar as the raw body (Content-Type application/x-tar), a multipart `package`, or
    JSON `{"url": "file://|http://|https://…", "sha256": "<sha of the tar>"}` (AgentZero's install --url).

    A worker unpacks it (never this process), refusing links, `..`, more than 64 entries and anything that expands
    past the module size policy; 413 for a package too large, 504 when no worker answered."""
    upload = request.FILES.get("package")
    if upload is None and request.content_type == "application/json":
        body = parse_body(request)
        if not isinstance(body.get("url"), str) or not body["url"]:
            raise ApiError(400, "validation_error", 'a JSON body needs "url" (and optionally "sha256")')
        sha = body.get("sha256") if isinstance(body.get("sha256"), str) else None
        info = await tool_service.install(actor(request), url=body["url"], sha256=sha, source="url")
        return json_response(info, 201)
    if upload is None and request.content_type and request.content_type.startswith("multipart/"):
        raise ApiError(400, "validation_error", "multipart upload needs a `package` file field")
    if upload is None and not request.body:
        raise ApiError(400, "validation_error", "send the package tar as the body, as a multipart `package` "
                                                'file, or {"url": …, "sha256": …}')
    chunks = upload.chunks() if upload is not None else [request.body]
    info = await tool_service.install(actor(request), chunks=chunks, source="local")
    return json_response(info, 201)


@router.post("/package", response=ERRORS, operation_id="tools_package")
def package(request):
    """Multipart `manifest` (manifest.json) + `wasm` (the module) → the package tar with wasm_sha256 recomputed."""
    manifest, wasm = _upload(request, "manifest"), _upload(request, "wasm")
    if manifest is None or wasm is None:
        raise ApiError(400, "validation_error", "multipart fields `manifest` and `wasm` are both required")
    data = tool_service.package(manifest, wasm)
    name = f"{json.loads(manifest)['id']}.tar"  # package() validated the manifest
    response = HttpResponse(data, content_type="application/x-tar")
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


@router.get("/{tool_id}", response={200: dict, **ERRORS}, operation_id="tools_get")
def get_tool(request, tool_id: str):
    return json_response(tool_selectors.get_tool(tool_id))


@router.post("/{tool_id}/execute", response={200: ToolRunOut, **ERRORS, 503: ToolRunOut, 504: ToolRunOut},
             operation_id="tools_execute", openapi_extra=body_of(ToolExecuteIn))
async def execute(request, tool_id: str):
    """`{"input": "..."}` → `{"output", "error"}` (AgentZero's tool result mapping), run by a worker.

    `input` is the raw tool-call argument string; any other JSON value is passed as its JSON text. A module failure is
    a 200 with `ok: false`, `output: ""` and `error` (plus `kind`); unknown tool 404, disabled 409, no worker 504.
    """
    data = parse_body(request)
    if "input" not in data:
        raise ApiError(400, "validation_error", "the body needs an `input` field (the tool-call argument string)")
    text = tool_service.check_input(data["input"])
    status, body = await tool_service.execute(tool_id, text)
    return json_response(body, status)


def _toggle(request, tool_id: str, enabled: bool):
    return json_response(tool_service.set_enabled(tool_id, enabled, actor(request)))


@router.post("/{tool_id}/enable", response={200: dict, **ERRORS},
             operation_id="tools_enable")
def enable(request, tool_id: str):
    return _toggle(request, tool_id, True)


@router.post("/{tool_id}/disable", response={200: dict, **ERRORS},
             operation_id="tools_disable")
def disable(request, tool_id: str):
    return _toggle(request, tool_id, False)


@router.delete("/{tool_id}", response={200: dict, **ERRORS},
               operation_id="tools_remove")
def remove(request, tool_id: str, version: str | None = None):
    removed = tool_service.remove(tool_id, actor(request), version)
    return json_response({"removed": removed, "id": tool_id})
