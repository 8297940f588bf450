"""`librefang plugin list|show|scaffold|reload|enable|disable|doctor|lint|install|uninstall|update|install-deps|
test-hook|use|export|state|benchmark|prewarm|registry-search|update-check|permissions|approve` against the local
installation ($LIBREFANG_HOME and the service database).

Exit codes: 0 ok; 1 the check or hook failed (lint errors, doctor problems, failed test-hook); 2 invalid input;
3 not found; 4 conflict (already exists, locally modified). Errors go to stderr. `--json` gives machine output.

test-hook runs through a live worker when one is heartbeating (like the dashboard), otherwise in this process
with the same engine code (the CLI is not the web tier); the output says which.

This module parses the arguments, turns a PluginError into its exit code and writes the output; the actions are in
plugins_app/management/plugin_actions/ (one module per group of subcommands).
"""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from engine import hooks as H
from plugins_app.management.plugin_actions import ACTIONS
from plugins_app.services.plugins import PluginError

EXIT = {400: 2, 404: 3, 409: 4, 413: 2, 422: 1}


class Command(BaseCommand):
    help = "Manage context-engine plugins of the local installation."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")

        def add(name, help_text, plugin=True):
            p = sub.add_parser(name, help=help_text)
            if plugin:
                p.add_argument("name")
            p.add_argument("--json", action="store_true", help="machine-readable output")
            return p

        add("list", "installed plugins", plugin=False)
        add("show", "one plugin in detail")
        s = add("scaffold", "create a plugin from templates")
        s.add_argument("--runtime", default="python")
        s.add_argument("--description", default="")
        s.add_argument("--hook", action="append", dest="hooks", choices=H.ALL_HOOKS,
                       help="hook to declare (repeatable; default: ingest and after_turn)")
        add("reload", "re-read plugin.toml now")
        add("enable", "enable a plugin")
        add("disable", "disable a plugin")
        d = add("doctor", "probe runtimes and check every plugin", plugin=False)
        d.add_argument("--fresh", action="store_true", help="probe again instead of using the 30 s cache")
        add("lint", "lint one plugin (exit 1 on errors)")
        i = add("install", "install from a local path, a git URL or a registry", plugin=False)
        i.add_argument("source", nargs="?", help="a local directory or a git URL")
        i.add_argument("--ref", help="git branch, tag or commit")
        i.add_argument("--registry", help="registry: git URL, owner/repo or local dir with plugins/<name>/")
        i.add_argument("--name", help="plugin name (registry installs)")
        add("uninstall", "remove a plugin")
        u = add("update", "re-fetch a plugin from its recorded source")
        u.add_argument("--force", action="store_true", help="overwrite local edits")
        add("install-deps", "install the plugin's requirements")
        t = add("test-hook", "run one hook of a plugin with a sample or given request")
        t.add_argument("hook", choices=H.ALL_HOOKS)
        t.add_argument("--input", help="request JSON, @file, or - for stdin (default: a sample request)")
        t.add_argument("--timeout", type=float, default=None)
        e = add("export", "write the plugin and its lock entry as a .tar.gz")
        e.add_argument("-o", "--output", help="file to write (default: ./<name>.tar.gz; - for stdout)")
        st = add("state", "show the plugin's data directory")
        st.add_argument("--wipe", action="store_true", help="empty it instead")
        b = add("benchmark", "run each hook N times and print p50/p95")
        b.add_argument("--hook", choices=H.ALL_HOOKS, help="only this hook")
        b.add_argument("--runs", type=int, default=5, help="runs per hook (1-50, default 5)")
        pw = add("prewarm", "start the warm zygotes and fetch the bundles of one plugin (default: every enabled "
                            "plugin) on every live worker", plugin=False)
        pw.add_argument("name", nargs="?", default=None)
        pw.add_argument("--wait", type=float, default=None, help="seconds to wait for the workers' answers")
        rs = add("registry-search", "search a registry's plugins", plugin=False)
        rs.add_argument("query", nargs="?", default="")
        rs.add_argument("--registry", help="registry (default: the first configured)")
        add("update-check", "compare the installed plugin with its source (changes nothing)")
        add("permissions", "what the plugin asks beyond the defaults, and what changed since its last approved version")
        ap = add("approve", "approve what the plugin.toml on disk asks beyond the defaults (owner's act, audited)")
        ap.add_argument("--sha256", help="only if plugin.toml is still this version (from `permissions --json`)")
        use = sub.add_parser("use", help="make plugins the active context engine (none: the default engine)")
        use.add_argument("names", nargs="*")
        use.add_argument("--json", action="store_true")

    # ---- plumbing ----

    def handle(self, *args, action: str, **opts):
        self.as_json = opts.pop("json", False)
        try:
            ACTIONS[action](self, **opts)
        except PluginError as exc:
            raise CommandError(f"{exc.code}: {exc.message}{self._details(exc.details)}",
                               returncode=EXIT.get(exc.status, 1)) from exc

    @staticmethod
    def _details(details) -> str:
        if not details:
            return ""
        if isinstance(details, list):
            return "".join(f"\n  - {d.get('message', d) if isinstance(d, dict) else d}" for d in details)
        return "\n  " + json.dumps(details)

    def out(self, data, text: str | None = None) -> None:
        if self.as_json or text is None:
            self.stdout.write(json.dumps(data, indent=2, default=str))
        else:
            self.stdout.write(text)

