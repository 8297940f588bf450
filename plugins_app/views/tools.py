"""Dashboard page for WASM tool plugins: list with state, install a package, enable/disable/remove, try-it console.

The console runs module code, so it goes through a worker like the API does (services.tools.execute).
"""

from __future__ import annotations

import time

from asgiref.sync import sync_to_async
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponseNotAllowed
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from engine.wasm import tools as T
from plugins_app.selectors import tools as tool_selectors
from plugins_app.services import tools as tool_service
from plugins_app.views.roles import actor, role_required, user_may


def _page(request, status: int = 200, error: str | None = None):
    tools = tool_selectors.list_tools()
    return render(request, "plugins_app/tools.html", {
        "tools": tools, "runnable": [t for t in tools if t["enabled"]],
        "policy": tool_selectors.policy_summary(), "policy_error": tool_selectors.policy_error(),
        "tools_dir": tool_selectors.tools_dir(), "error": error, "may_own": user_may(request.user, "tools_install"),
        "may_admin": user_may(request.user, "tools_enable"),
    }, status=status)


@login_required
@require_GET
def tools_page(request):
    return _page(request)


@login_required
@require_POST
@role_required("tools_install")
async def tool_install(request):
    """The package is unpacked by a worker (services.tools.install), never in this process."""
    upload = request.FILES.get("package")
    if upload is None:
        return await sync_to_async(_page)(request, 400, "Choose a package (.tar) to install.")
    try:
        info = await tool_service.install(await sync_to_async(actor)(request), chunks=upload.chunks(),
                                          source="upload")
    except T.ToolError as exc:
        return await sync_to_async(_page)(request, exc.status if exc.status < 500 else 400,
                                          f"Not installed: {exc.message}")
    await sync_to_async(messages.success)(request, f"Installed {info['id']} {info['version']}.")
    return redirect("tools")


@login_required
@require_POST
@role_required("tools_{action}")
def tool_action(request, tool_id: str, action: str):
    try:
        if action == "enable":
            tool_service.set_enabled(tool_id, True, actor(request))
        elif action == "disable":
            tool_service.set_enabled(tool_id, False, actor(request))
        elif action == "remove":
            tool_service.remove(tool_id, actor(request))
        else:
            return _page(request, 400, f"Unknown action {action!r}.")
    except T.ToolError as exc:
        return _page(request, exc.status, exc.message)
    messages.success(request, f"{tool_id}: {action}d.")
    return redirect("tools")


@login_required
@role_required("owner")
async def tool_execute(request):
    """Try-it console: run the chosen tool with the typed input through a worker; render output, error and logs."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    arender = sync_to_async(render)
    tool_id = request.POST.get("tool", "")
    text = request.POST.get("input", "")
    started = time.monotonic()
    try:
        status, body = await tool_service.execute(tool_id, tool_service.check_input(text))
    except T.ToolError as exc:
        return await arender(request, "plugins_app/partials/tool_result.html",
                             {"refused": exc.message, "tool": tool_id}, status=exc.status)
    return await arender(request, "plugins_app/partials/tool_result.html", {
        "result": body, "tool": tool_id, "waited_ms": round((time.monotonic() - started) * 1000, 1),
    }, status=200 if status == 200 else status)
