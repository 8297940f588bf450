"""Dashboard pages for plugins (server-rendered, htmx). Thin: they call selectors and services."""

from __future__ import annotations

import json
import time

from asgiref.sync import sync_to_async
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse, HttpResponseNotAllowed
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from engine.hooks import ALL_HOOKS
from plugins_app import events
from plugins_app.forms import CreatePluginForm, InstallForm, TestHookForm
from plugins_app.selectors import dashboard
from plugins_app.selectors import plugins as plugin_selectors
from plugins_app.selectors.examples import example_request
from plugins_app.services import bundles
from plugins_app.services import hooks as hook_service
from plugins_app.services import plugins as plugin_service
from plugins_app.views.roles import actor, role_required  # noqa: F401 (views/engine.py, tokens.py)

TEST_TIMEOUT_CAP_SECS = 120.0


def _lang(request) -> str | None:
    return request.headers.get("Accept-Language")


@login_required
@require_GET
def plugin_list(request):
    filters = {"enabled": request.GET.get("enabled", ""), "errors": bool(request.GET.get("errors")),
               "runtime": request.GET.get("runtime", ""), "q": request.GET.get("q", "").strip()[:200]}
    if filters["enabled"] not in ("", "yes", "no"):
        filters["enabled"] = ""
    sort = request.GET.get("sort", "name")
    sort = sort if sort in dashboard.SORT_KEYS else "name"
    desc = request.GET.get("dir") == "desc"
    all_plugins = plugin_selectors.list_plugins(_lang(request))
    rows = dashboard.plugin_rows(_lang(request), **filters, sort=sort, desc=desc)
    return render(request, "plugins_app/plugin_list.html", {
        "rows": rows, "total": len(all_plugins), "filters": filters, "hooks": ALL_HOOKS,
        "runtimes": sorted({p.runtime for p in all_plugins if p.runtime}),
        "chain": plugin_selectors.active_chain(), "sort": sort, "desc": desc,
        "columns": _sort_columns(request, sort, desc),
    })


def _sort_columns(request, sort: str, desc: bool) -> list[dict]:
    """Table headers: a link that sorts by the column (again: reverses it), keeping the filters."""
    labels = [("name", "Plugin", False), ("runtime", "Runtime", False), ("state", "State", False),
              (None, "Hooks", False), ("calls", "Calls (1 h)", True), ("errors", "Errors per hook", True),
              ("p95", "p95", True)]
    out = []
    for key, label, numeric in labels:
        if key is None:
            out.append({"label": label, "numeric": numeric})
            continue
        params = request.GET.copy()
        params["sort"] = key
        active = key == sort
        params["dir"] = "asc" if active and desc else ("desc" if active or numeric else "asc")
        out.append({"key": key, "label": label, "numeric": numeric, "url": "?" + params.urlencode(),
                    "aria_sort": ("descending" if desc else "ascending") if active else None})
    return out


def _pretty(value) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)


@login_required
@require_GET
def plugin_detail(request, name: str):
    plugin = plugin_selectors.get_plugin(name, _lang(request))
    if plugin is None:
        raise Http404(f"no plugin named {name}")
    declared = [h for h in ALL_HOOKS if plugin.hooks.get(h)]
    entry = plugin_selectors.installed_entry(name)
    facts = []
    if entry is not None and entry.plugin is not None:
        hs = entry.plugin.manifest.hooks
        facts = [("Hook timeout", f"{hs.hook_timeout_secs:g} s"), ("On failure", getattr(hs, "on_hook_failure", "")),
                 ("Retries", getattr(hs, "max_retries", ""))]
    return render(request, "plugins_app/plugin_detail.html", {
        "plugin": plugin, "hook_rows": dashboard.hook_rows(name), "declared_hooks": declared,
        "hook_names": declared, "example": _pretty(example_request(declared[0])) if declared else "",
        "findings": dashboard.plugin_findings(name), "manifest_facts": facts, "raw_manifest": dashboard.raw_manifest(plugin.path),
        "traces": dashboard.recent_traces(name), "audit": dashboard.audit(15, target=name),
        "stderr_backlog": events.recent_lines(name),
        "snippets": dashboard.curl_snippets(request.build_absolute_uri("/").rstrip("/"), name, declared),
        "bundle": bundles.active_version(name),
    })


ACTIONS = ("reload", "enable", "disable", "uninstall")


@login_required
@require_POST
@role_required("plugins_{action}")
def plugin_action(request, name: str, action: str):
    if action not in ACTIONS:
        raise Http404("unknown action")
    try:
        if action == "uninstall":
            plugin_service.uninstall_plugin(name, actor(request))
            messages.success(request, f"{name} was uninstalled.")
            if request.htmx:
                return HttpResponse(status=204, headers={"HX-Redirect": reverse("plugin_list")})
            return redirect("plugin_list")
        if action == "reload":
            result = plugin_service.reload_plugin(name, actor(request))
            message = result.get("message") or "Reloaded."
            warnings = result.get("warnings") or []
        else:
            result = plugin_service.set_enabled(name, action == "enable", actor(request))
            message = result.get("message") or f"{name} {action}d."
            before = plugin_selectors.get_plugin(name)
            if action == "disable" and before is not None and before.in_chain:
                message += (f". It is in the active context engine: agents now get the built-in default engine "
                            f"(fallback_reason: plugin_disabled: {name} is disabled).")
            warnings = []
        ok, details = True, warnings
    except plugin_service.PluginError as exc:
        ok, message, details = False, exc.message, exc.details if isinstance(exc.details, list) else []
    plugin = plugin_selectors.get_plugin(name, _lang(request))
    if not request.htmx:
        return redirect("plugin_detail", name=name)
    return render(request, "plugins_app/partials/action_feedback.html", {
        "ok": ok, "message": message, "details": details, "plugin": plugin, "action": action,
        "audit": dashboard.audit(15, target=name) if plugin else None,
    }, status=200)


def _test_timeout(name: str, hook: str) -> float:
    return min(plugin_selectors.hook_timeout_secs(name, hook), TEST_TIMEOUT_CAP_SECS)


def _installed(name: str):
    return plugin_selectors.get_plugin(name)


@login_required
@role_required("plugins_test_hook")
async def plugin_test_hook(request, name: str):
    """Run one hook of this plugin through a worker with the console's JSON; show reply, stderr and timing."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    arender = sync_to_async(render)  # templates touch request.user lazily: render off the event loop
    plugin = await sync_to_async(_installed)(name)
    if plugin is None:
        raise Http404(f"no plugin named {name}")
    form = TestHookForm(request.POST)
    if not form.is_valid():
        return await arender(request, "plugins_app/partials/test_result.html", {"errors": form.errors})
    hook, payload = form.cleaned_data["hook"], form.cleaned_data["payload"]
    if not plugin.hooks.get(hook):
        return await arender(request, "plugins_app/partials/test_result.html",
                             {"errors": {"hook": [f"{name} does not declare the {hook} hook."]}})
    timeout = await sync_to_async(_test_timeout)(name, hook)
    started = time.monotonic()
    result = await hook_service.test_hook(name, hook, payload, timeout)
    waited_ms = round((time.monotonic() - started) * 1000, 1)
    return await arender(request, "plugins_app/partials/test_result.html", {
        "result": result, "hook": hook, "waited_ms": waited_ms, "plugin_name": name,
        "reply_json": _pretty(result.get("reply")) if result.get("reply") is not None else None,
    })


@login_required
@require_GET
def plugin_test_example(request, name: str):
    hook = request.GET.get("hook", "")
    if hook not in ALL_HOOKS:
        return HttpResponse("unknown hook", status=400)
    return render(request, "plugins_app/partials/test_payload.html", {"payload": _pretty(example_request(hook))})


@login_required
@role_required("plugins_scaffold")
def plugin_create(request):
    runtimes = dashboard.runtime_choices()
    if request.method == "POST":
        form = CreatePluginForm(request.POST)
        if form.is_valid():
            d = form.cleaned_data
            try:
                plugin_service.scaffold_plugin(d["name"], d["description"], d["runtime"], d["hooks"], actor(request),
                                               author=d["author"])
            except plugin_service.PluginError as exc:
                form.add_error("name" if exc.code in ("already_exists", "invalid_name") else None, exc.message)
            else:
                return redirect("plugin_detail", name=d["name"])
    else:
        form = CreatePluginForm()
    return render(request, "plugins_app/plugin_create.html", {"form": form, "runtimes": runtimes},
                  status=400 if form.errors else 200)


@login_required
@require_GET
def plugin_check_name(request):
    """As-you-type name check for the create form (htmx)."""
    name = request.GET.get("name", "")
    return render(request, "plugins_app/partials/name_check.html",
                  {"name": name.strip(), "problem": dashboard.name_problem(name)})


@login_required
@role_required("plugins_install")
def plugin_install(request):
    result = error = None
    if request.method == "POST":
        form = InstallForm(request.POST)
        if form.is_valid():
            try:
                result = plugin_service.install_plugin(form.source_dict(), actor(request))
            except plugin_service.PluginError as exc:
                error = exc
            else:
                return redirect("plugin_detail", name=result["name"])
    else:
        form = InstallForm()
    return render(request, "plugins_app/plugin_install.html", {"form": form, "error": error},
                  status=400 if (form.errors or error) else 200)
