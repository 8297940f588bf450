"""Reads shaped for the dashboard pages: plugin rows, per-hook figures with a latency chart, engine totals,
runtimes for the create form, tokens and audit. Pure reads; writes live in services."""

from __future__ import annotations

import datetime as dt

from django.contrib.auth.models import AbstractBaseUser
from django.utils import timezone

from engine.hooks import ALL_HOOKS
from engine.plugins.manifest import NAME_RE
from engine.process.runtimes import RUNTIMES, find_launcher
from plugins_app.home import home
from plugins_app.models import ApiToken, AuditEntry, HookMetric, HookMetricBucket
from plugins_app.selectors import config as config_selectors
from plugins_app.selectors import metrics as metric_selectors
from plugins_app.selectors import outcomes
from plugins_app.selectors import plugins as plugin_selectors
from plugins_app.selectors.doctor import lint
from plugins_app.selectors.traces import list_traces

OWNER_GROUP = "owner"
CHART_W, CHART_H = 240, 48


def is_owner(user: AbstractBaseUser) -> bool:
    if not user.is_authenticated:
        return False
    return bool(user.is_superuser or user.groups.filter(name=OWNER_GROUP).exists())


ROLE_RANK = {"viewer": 1, "admin": 2, "owner": 3}


def user_role(user: AbstractBaseUser) -> str | None:
    if not user.is_authenticated:
        return None
    if is_owner(user):
        return "owner"
    return "admin" if user.is_staff else "viewer"


def user_may(user: AbstractBaseUser, role: str) -> bool:
    have = user_role(user)
    return have is not None and ROLE_RANK[have] >= ROLE_RANK[role]


# ---- plugins page ----

def plugin_row(name: str, lang: str | None = None, hour: dict | None = None) -> dict | None:
    summary = plugin_selectors.get_plugin(name, lang)
    if summary is None:
        return None
    if hour is None:
        hour = metric_selectors.last_hour(name)
    return {"plugin": summary, "hour": hour.get(name)}


SORT_KEYS = {
    "name": lambda r: r["plugin"].name.lower(),
    "runtime": lambda r: (r["plugin"].runtime or "~", r["plugin"].name.lower()),
    "state": lambda r: (r["plugin"].state, r["plugin"].name.lower()),
    "calls": lambda r: ((r["hour"] or {}).get("calls") or 0, r["plugin"].name.lower()),
    "errors": lambda r: (max((h["error_rate"] for h in (r["hour"] or {}).get("hooks") or []), default=0),
                         (r["hour"] or {}).get("failures") or 0),
    "p95": lambda r: ((r["hour"] or {}).get("p95_ms") or 0, r["plugin"].name.lower()),
}


def plugin_rows(lang: str | None = None, *, enabled: str = "", errors: bool = False, runtime: str = "",
                q: str = "", sort: str = "name", desc: bool = False) -> list[dict]:
    """Rows for the plugins table. enabled: "" (any), "yes" or "no"; errors: only plugins with failures in the
    last hour or problems (invalid manifest, missing hook files, cannot run); runtime: one runtime tag; q: words
    that must all appear in the name, display name, description or author; sort: a SORT_KEYS key."""
    hour = metric_selectors.last_hour()
    words = [w for w in (q or "").lower().split() if w]
    rows = []
    for p in plugin_selectors.list_plugins(lang):
        row = {"plugin": p, "hour": hour.get(p.name)}
        if enabled == "yes" and not p.enabled or enabled == "no" and p.enabled:
            continue
        if runtime and p.runtime != runtime:
            continue
        if errors and not (not p.valid or not p.hooks_valid or p.cannot_run or p.failing
                           or (row["hour"] and row["hour"]["failures"])):
            continue
        haystack = " ".join((p.name, p.display_name, p.description, p.author)).lower()
        if any(w not in haystack for w in words):
            continue
        rows.append(row)
    rows.sort(key=SORT_KEYS.get(sort, SORT_KEYS["name"]), reverse=desc)
    return rows


def runtimes_in_use() -> list[str]:
    return sorted({p.runtime for p in plugin_selectors.list_plugins() if p.runtime})


# ---- plugin page ----

def _chart(buckets: list[HookMetricBucket], now: dt.datetime) -> dict:
    """Average latency per minute over the last 60 minutes as SVG bars (minutes with failures marked),
    scaled to CHART_W x CHART_H."""
    start = (now - dt.timedelta(minutes=59)).replace(second=0, microsecond=0)
    points: dict[int, tuple[float, int, int]] = {}
    for b in buckets:
        idx = int((b.minute - start).total_seconds() // 60)
        if 0 <= idx < 60 and b.calls:
            points[idx] = (b.latency_ms_total / b.calls, b.calls, b.failures)
    if not points:
        return {"empty": True, "w": CHART_W, "h": CHART_H}
    top = max(v for v, _c, _f in points.values()) or 1.0
    slot = CHART_W / 60
    usable = CHART_H - 4
    bars = []
    for i, (avg, calls, failures) in sorted(points.items()):
        h = max(2.0, round(avg / top * usable, 1))
        bars.append({"x": round(i * slot + 0.5, 1), "y": round(CHART_H - 2 - h, 1), "w": round(max(slot - 1, 1), 1),
                     "h": h, "failed": bool(failures),
                     "title": f"{59 - i} min ago: {calls} call(s), avg {avg:.1f} ms"
                              + (f", {failures} failed" if failures else "")})
    return {
        "empty": False, "w": CHART_W, "h": CHART_H, "max_ms": round(top, 1), "bars": bars,
        "label": f"average latency per minute over the last hour, peak {top:.1f} ms",
    }


def hook_rows(name: str) -> list[dict]:
    """Per declared hook: script, totals since reset, percentiles, last call and a latency chart."""
    summary = plugin_selectors.get_plugin(name)
    if summary is None:
        return []
    metrics = {m.hook: m for m in HookMetric.objects.filter(plugin=name)}
    now = timezone.now()
    since = (now - dt.timedelta(minutes=59)).replace(second=0, microsecond=0)
    buckets: dict[str, list[HookMetricBucket]] = {}
    for b in HookMetricBucket.objects.filter(plugin=name, minute__gte=since):
        buckets.setdefault(b.hook, []).append(b)
    rows = []
    for hook in ALL_HOOKS:
        script = summary.hooks.get(hook)
        m = metrics.get(hook)
        if not script and m is None:
            continue
        rows.append({
            "plugin": name, "hook": hook, "script": script,
            "stats": metric_selectors.hook_stats(m) if m else None,
            "last_called_at": m.last_called_at if m else None,
            "chart": _chart(buckets.get(hook, []), now),
        })
    return rows


def curl_snippets(base_url: str, name: str, hooks: list[str]) -> list[dict]:
    """Ready-to-paste curl calls per declared hook: the agent route (answered by the active engine, so by this
    plugin only while it serves) and the plugin's own test-hook route. The token stays a shell variable."""
    import json
    import shlex

    from plugins_app.selectors.examples import example_request

    out = []
    for hook in hooks:
        body = json.dumps(example_request(hook), ensure_ascii=False, separators=(",", ":"))
        test_body = json.dumps({"hook": hook, "input": example_request(hook)}, ensure_ascii=False,
                               separators=(",", ":"))
        head = '  -H "Authorization: Bearer $LIBREFANG_TOKEN" -H "Content-Type: application/json" \\\n'
        out.append({
            "hook": hook,
            "agent": f"curl -sS -X POST {shlex.quote(f'{base_url}/api/context-engine/hooks/{hook}')} \\\n"
                     + head + f"  -d {shlex.quote(body)}",
            "test": f"curl -sS -X POST {shlex.quote(f'{base_url}/api/plugins/{name}/test-hook')} \\\n"
                    + head + f"  -d {shlex.quote(test_body)}",
        })
    return out


def hook_row(name: str, hook: str) -> dict | None:
    return next((r for r in hook_rows(name) if r["hook"] == hook), None)


def raw_manifest(path: str) -> str:
    from pathlib import Path

    try:
        return (Path(path) / "plugin.toml").read_text(encoding="utf-8", errors="replace")[:200_000]
    except OSError as exc:
        return f"(could not read plugin.toml: {exc})"


def recent_traces(name: str, limit: int = 15) -> list[dict]:
    return list_traces(plugin=name, limit=limit)


def plugin_findings(name: str) -> list[dict]:
    """Lint errors and warnings for one plugin (the doctor panel), or the catalog's problems if lint fails."""
    try:
        report = lint(name)
    except KeyError:
        return []
    return [*outcomes.findings(name), *report["errors"], *report["warnings"]]


# ---- context engine page ----

def engine_hook_totals() -> list[dict]:
    """Per hook across every plugin: calls, failures, latency percentiles since the last reset."""
    agg: dict[str, dict] = {}
    for m in HookMetric.objects.all():
        a = agg.setdefault(m.hook, {"calls": 0, "failures": 0, "latency_ms_total": 0.0, "histogram": {},
                                    "plugins": set(), "last_called_at": None})
        a["calls"] += m.calls
        a["failures"] += m.failures
        a["latency_ms_total"] += m.latency_ms_total
        a["plugins"].add(m.plugin)
        for k, v in (m.histogram or {}).items():
            a["histogram"][k] = a["histogram"].get(k, 0) + v
        if m.last_called_at and (a["last_called_at"] is None or m.last_called_at > a["last_called_at"]):
            a["last_called_at"] = m.last_called_at
    installed = set(plugin_selectors.installed_names())  # metrics outlive uninstalled plugins: shown without a link
    rows = []
    for hook in ALL_HOOKS:
        a = agg.get(hook)
        if a is None:
            rows.append({"hook": hook, "calls": 0, "failures": 0, "error_rate": None, "p50_ms": None, "p95_ms": None,
                         "plugins": [], "last_called_at": None})
            continue
        rows.append({
            "hook": hook, "calls": a["calls"], "failures": a["failures"],
            "error_rate": round(100 * a["failures"] / a["calls"], 1) if a["calls"] else None,
            "p50_ms": metric_selectors.percentile(a["histogram"], 0.5),
            "p95_ms": metric_selectors.percentile(a["histogram"], 0.95),
            "plugins": [{"name": n, "installed": n in installed} for n in sorted(a["plugins"])],
            "last_called_at": a["last_called_at"],
        })
    return rows


def engine_state() -> dict:
    """The active configuration, the chain with each layer's state, and the installed plugins to choose from."""
    chain = config_selectors.chain()["chain"]
    return {"config": config_selectors.engine_config(), "chain": chain,
            "serving": [layer["plugin"] for layer in chain if layer["serving"]],
            "failing": [f"{layer['plugin']} ({', '.join(layer['failing'])})" for layer in chain if layer.get("failing")],
            "installed": plugin_selectors.installed_names()}


# ---- create form ----

def runtime_choices() -> list[dict]:
    out = []
    for tag, rt in RUNTIMES.items():
        available = rt.launcher is None or find_launcher(tag) is not None
        out.append({"tag": tag, "available": available, "install_hint": "" if available else rt.install_hint,
                    "launcher": rt.launcher or ("built in" if rt.is_wasm else "the script itself")})
    return out


def name_problem(name: str) -> str | None:
    """Why `name` can't be used for a new plugin, or None when it can."""
    name = (name or "").strip()
    if not name:
        return "Enter a name."
    if len(name) > 128:
        return f"At most 128 characters: this one has {len(name)}."
    if not NAME_RE.match(name):
        return ("Use letters, digits, '-' and '_' only, starting with a letter or digit (at most 128 "
                "characters).")
    if plugin_selectors.is_installed(name) or home().plugin_dir(name).exists():
        return f"A plugin named {name} already exists."
    twin = next((n for n in plugin_selectors.installed_names() if n.casefold() == name.casefold()), None)
    if twin:
        return f"A plugin named {twin} already exists: names that differ only by case are refused."
    return None


# ---- tokens and audit ----

def live_token(pk) -> ApiToken | None:
    """The token with this id, unless it was revoked since (the one-time display of a new token's secret)."""
    return ApiToken.objects.filter(pk=pk, revoked_at__isnull=True).first()


def tokens() -> list[ApiToken]:
    return list(ApiToken.objects.select_related("created_by").order_by("revoked_at", "-created_at")[:200])


def audit(limit: int = 100, target: str | None = None) -> list[AuditEntry]:
    qs = AuditEntry.objects.all()
    if target:
        qs = qs.filter(target=target)
    return list(qs.order_by("-at")[:limit])
