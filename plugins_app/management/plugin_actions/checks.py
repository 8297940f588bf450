"""`plugin doctor` and `plugin lint`: the findings the dashboard shows, as text or JSON; exit 1 on problems."""

from __future__ import annotations

import sys

from django.core.management.base import CommandError

from plugins_app.management.plugin_actions.common import Cli
from plugins_app.selectors import doctor as doctor_selectors


def doctor(cmd: Cli, fresh=False, **_) -> None:
    report = doctor_selectors.doctor(fresh=fresh)
    if cmd.as_json:
        cmd.out(report)
    else:
        lines = ["Runtimes:"]
        for r in report["runtimes"]:
            state = (r["version"] or "available") if r["available"] else f"MISSING - {r['install_hint']}"
            lines.append(f"  {r['runtime']:<7} {state}")
        lines.append("Plugins:" if report["plugins"] else "Plugins: none installed")
        for p in report["plugins"]:
            lines.append(f"  {p['name']:<24} {'ok' if p['ok'] else 'PROBLEMS'} (runtime {p['runtime']}"
                         f"{'' if p['runtime_available'] else ' missing'})")
            lines += [f"    {_finding(f)}" for f in p["findings"]]
        cmd.stdout.write("\n".join(lines))
    if not report["ok"]:
        sys.exit(1)


def lint(cmd: Cli, name, **_) -> None:
    try:
        report = doctor_selectors.lint(name)
    except KeyError as exc:
        raise CommandError(f"plugin {name!r} is not installed", returncode=3) from exc
    if cmd.as_json:
        cmd.out(report)
    else:
        lines = [f"{name}: {'ok' if report['ok'] else 'ERRORS'}"]
        lines += [f"  {_finding(f)}" for f in report["errors"] + report["warnings"]]
        cmd.stdout.write("\n".join(lines))
    if not report["ok"]:
        sys.exit(1)


def _finding(f: dict) -> str:
    return f"{f['severity']}: {f['message']}" + (f" ({f['hint']})" if f["hint"] else "")
