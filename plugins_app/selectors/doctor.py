"""The doctor: every runtime probed (5 s cap, cached briefly) and every installed plugin checked."""

from __future__ import annotations

from engine.plugins.doctor import probe_all
from engine.plugins.lint import hooks_valid, lint_plugin
from plugins_app.home import catalog as plugin_catalog
from plugins_app.home import home
from plugins_app.selectors import outcomes
from plugins_app.selectors.permissions import unapproved_finding
from plugins_app.selectors.tools import policy as wasm_policy


def doctor(fresh: bool = False) -> dict:
    runtimes = probe_all(max_age=0 if fresh else 30)
    by_tag = {r.runtime: r for r in runtimes}
    catalog = plugin_catalog()
    names = catalog.names()
    installed = set(names)
    bad = outcomes.failing()
    plugins = []
    for name in names:
        entry = catalog.get(name)
        m = entry.plugin.manifest if entry.plugin else None
        label = m.runtime.label if m else None
        tag = m.runtime.runtime.tag if m else None
        status = by_tag.get(tag) if tag and not (m and m.runtime.custom_launcher) else None
        if m and m.runtime.custom_launcher:
            import os

            available = os.access(m.runtime.custom_launcher, os.X_OK)
            hint = m.runtime.runtime.install_hint
        else:
            available = bool(status and status.available)
            hint = status.install_hint if status else ""
        report = lint_plugin(entry.dir, installed, wasm_policy())
        failing = outcomes.findings(name, bad)
        unapproved = unapproved_finding(name)
        plugins.append({
            "name": name,
            "runtime": label,
            "runtime_available": available,
            "install_hint": None if available else hint,
            "hooks_valid": bool(m) and hooks_valid(entry.dir, m.hooks.declared_hooks()),
            "enabled": entry.enabled,
            "ok": report.ok and available and not failing,
            "failing": bad.get(name, {}),
            "findings": [*failing, *(f.to_dict() for f in report.findings),
                         *([unapproved] if unapproved is not None else [])],
        })
    return {"runtimes": [r.to_dict() for r in runtimes], "plugins": plugins,
            "ok": all(p["ok"] for p in plugins)}


def lint(name: str) -> dict:
    """Lint report for one installed plugin; raises KeyError when it is not installed."""
    catalog = plugin_catalog()
    if not catalog.exists(name):
        raise KeyError(name)
    return lint_plugin(home().plugin_dir(name), set(catalog.names()), wasm_policy()).to_dict()
