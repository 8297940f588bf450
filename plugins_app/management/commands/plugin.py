"""`librefang plugin list|show|scaffold|reload|enable|disable|doctor|lint|install|uninstall|update|install-deps|
test-hook|use|export|state|benchmark|prewarm|registry-search|update-check` against the local installation ($LIBREFANG_HOME
and the service database).

Exit codes: 0 ok; 1 the check or hook failed (lint errors, doctor problems, failed test-hook); 2 invalid input;
3 not found; 4 conflict (already exists, locally modified). Errors go to stderr. `--json` gives machine output.

test-hook runs through a live worker when one is heartbeating (like the dashboard), otherwise in this process
with the same engine code (the CLI is not the web tier); the output says which.
"""

from __future__ import annotations

import getpass
import json
import sys
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError
from pydantic import ValidationError

from engine import hook_requests
from engine import hooks as H
from plugins_app.selectors import doctor as doctor_selectors
from plugins_app.selectors import plugins as plugin_selectors
from plugins_app.selectors.examples import example_request
from plugins_app.services import plugins as plugin_service
from plugins_app.services.plugins import PluginError

EXIT = {400: 2, 404: 3, 409: 4, 413: 2, 422: 1}


def _actor() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except Exception:
        return "cli"


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
        use = sub.add_parser("use", help="make plugins the active context engine (none: the default engine)")
        use.add_argument("names", nargs="*")
        use.add_argument("--json", action="store_true")

    # ---- plumbing ----

    def handle(self, *args, action: str, **opts):
        self.as_json = opts.pop("json", False)
        try:
            getattr(self, "_" + action.replace("-", "_"))(**opts)
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

    def _summary(self, name: str):
        summary = plugin_selectors.get_plugin(name)
        if summary is None:
            raise CommandError(f"plugin {name!r} is not installed", returncode=3)
        return summary

    # ---- actions ----

    def _list(self, **_):
        items = [p.to_dict() for p in plugin_selectors.list_plugins()]
        if self.as_json:
            return self.out(items)
        if not items:
            return self.out(items, "no plugins installed")
        lines = [f"{'NAME':<24} {'RUNTIME':<8} {'STATE':<9} {'VALID':<6} HOOKS"]
        for p in items:
            hooks = ",".join(h for h, s in p["hooks"].items() if s) or "-"
            lines.append(f"{p['name']:<24} {p['runtime']:<8} {'enabled' if p['enabled'] else 'disabled':<9} "
                         f"{'yes' if p['valid'] and p['hooks_valid'] else 'NO':<6} {hooks}")
        self.out(items, "\n".join(lines))

    def _show(self, name, **_):
        self.out(self._summary(name).to_dict())

    def _scaffold(self, name, runtime, description, hooks, **_):
        s = plugin_service.scaffold_plugin(name, description, runtime, hooks, actor=_actor())
        self.out(s.to_dict(), f"created {s.name} ({s.runtime}) in {s.path}")

    def _reload(self, name, **_):
        r = plugin_service.reload_plugin(name, actor=_actor())
        self.out(r, f"reloaded {name} {r['version']}: hooks {', '.join(r['hooks']) or '-'}, "
                    f"timeout {r['hook_timeout_secs']:g}s")

    def _enable(self, name, **_):
        r = plugin_service.set_enabled(name, True, actor=_actor())
        self.out(r, r["message"])

    def _disable(self, name, **_):
        r = plugin_service.set_enabled(name, False, actor=_actor())
        self.out(r, r["message"])

    def _doctor(self, fresh=False, **_):
        report = doctor_selectors.doctor(fresh=fresh)
        if self.as_json:
            self.out(report)
        else:
            lines = ["Runtimes:"]
            for r in report["runtimes"]:
                state = (r["version"] or "available") if r["available"] else f"MISSING - {r['install_hint']}"
                lines.append(f"  {r['runtime']:<7} {state}")
            lines.append("Plugins:" if report["plugins"] else "Plugins: none installed")
            for p in report["plugins"]:
                lines.append(f"  {p['name']:<24} {'ok' if p['ok'] else 'PROBLEMS'} (runtime {p['runtime']}"
                             f"{'' if p['runtime_available'] else ' missing'})")
                for f in p["findings"]:
                    lines.append(f"    {f['severity']}: {f['message']}" + (f" ({f['hint']})" if f["hint"] else ""))
            self.stdout.write("\n".join(lines))
        if not report["ok"]:
            sys.exit(1)

    def _lint(self, name, **_):
        try:
            report = doctor_selectors.lint(name)
        except KeyError as exc:
            raise CommandError(f"plugin {name!r} is not installed", returncode=3) from exc
        if self.as_json:
            self.out(report)
        else:
            lines = [f"{name}: {'ok' if report['ok'] else 'ERRORS'}"]
            for f in report["errors"] + report["warnings"]:
                lines.append(f"  {f['severity']}: {f['message']}" + (f" ({f['hint']})" if f["hint"] else ""))
            self.stdout.write("\n".join(lines))
        if not report["ok"]:
            sys.exit(1)

    def _install(self, source=None, ref=None, registry=None, name=None, **_):
        if registry or (name and not source):
            body = {"source": "registry", "name": name, "registry": registry, "ref": ref}
        elif source and Path(source).expanduser().is_dir():
            body = {"source": "local", "path": str(Path(source).expanduser().resolve())}
        elif source:
            body = {"source": "git", "url": source, "ref": ref}
        else:
            raise CommandError("give a local directory, a git URL, or --registry/--name", returncode=2)
        r = plugin_service.install_plugin({k: v for k, v in body.items() if v is not None}, actor=_actor())
        self.out(r, f"installed {r['name']} {r['version']} into {r['path']}")

    def _uninstall(self, name, **_):
        r = plugin_service.uninstall_plugin(name, actor=_actor())
        self.out(r, f"removed {name}" + (" (it was in the active chain)" if r.get("was_active") else ""))

    def _update(self, name, force=False, **_):
        r = plugin_service.update_plugin(name, force, actor=_actor())
        self.out(r, f"updated {name}: {r.get('previous_version') or '?'} -> {r['version']}")

    def _install_deps(self, name, **_):
        from plugins_app import bus

        # through a worker when one is alive (as the API does), else in this process
        r = plugin_service.install_deps(name, actor=_actor(), via_worker=bus.worker_alive())
        self.out(r, str(r.get("output") or r.get("message") or "dependencies installed"))

    def _use(self, names, **_):
        r = plugin_service.set_engine_config(names[0] if len(names) == 1 else None,
                                             names if len(names) > 1 else None, actor=_actor())
        self.out(r, f"context engine: {r['mode']} {' -> '.join(r['chain']) if r['chain'] else '(default engine)'}")

    def _test_hook(self, name, hook, input=None, timeout=None, **_):  # noqa: A002
        self._summary(name)
        request = self._read_input(input) if input else example_request(hook)
        try:
            hook_requests.check(hook, request)
        except ValidationError as exc:
            raise CommandError(f"invalid {hook} request: {exc}", returncode=2) from exc

        result, via = _run_test_hook(name, hook, request, timeout)
        if self.as_json:
            self.out({**result, "via": via})
        else:
            self.stderr.write(f"ran {name}.{hook} {via} in {result.get('elapsed_ms')} ms (trace {result.get('trace_id')})")
            if result.get("stderr"):
                self.stderr.write("stderr:\n" + result["stderr"].rstrip())
            if result.get("ok"):
                self.stdout.write(json.dumps(result.get("reply"), indent=2))
            else:
                err = result.get("error") or {}
                self.stderr.write(f"FAILED: {err.get('kind')}: {err.get('message')}")
        if not result.get("ok"):
            sys.exit(1)

    def _export(self, name, output=None, **_):
        data = plugin_service.export_plugin(name, actor=_actor())
        if output == "-":
            sys.stdout.buffer.write(data)
            return
        path = Path(output or f"{name}.tar.gz")
        path.write_bytes(data)
        self.out({"plugin": name, "path": str(path.resolve()), "bytes": len(data)},
                 f"wrote {path} ({len(data)} bytes)")

    def _state(self, name, wipe=False, **_):
        from plugins_app.selectors.state import plugin_state

        if wipe:
            r = plugin_service.wipe_state(name, actor=_actor())
            return self.out(r, f"wiped {r['path']}: {r['files_removed']} files, {r['bytes_freed']} bytes")
        self._summary(name)
        r = plugin_state(name)
        lines = [f"{r['path']}: {r['file_count']} files, {r['size_bytes']} bytes"]
        lines += [f"  {f['size_bytes']:>10}  {f['path']}" for f in r["files"]]
        self.out(r, "\n".join(lines))

    def _benchmark(self, name, hook=None, runs=5, **_):
        from asgiref.sync import async_to_sync

        from plugins_app.services import benchmark as benchmark_service

        if not 1 <= runs <= benchmark_service.MAX_RUNS:
            raise CommandError(f"--runs must be 1-{benchmark_service.MAX_RUNS}", returncode=2)
        runner, via = _benchmark_runner()
        r = async_to_sync(benchmark_service.benchmark)(name, hook, None, runs, _actor(), runner)
        if runner is not None:  # in-process runs: their traces are written before the command exits
            from plugins_app.services.engine import invocation_sink

            invocation_sink().flush()
        lines = [f"{name}: {runs} runs per hook, {via}", f"{'HOOK':<22} {'OK':>3} {'ERR':>4} {'P50 ms':>9} "
                                                          f"{'P95 ms':>9} {'MAX ms':>9}"]
        for h in r["hooks"]:
            lat = h["latency_ms"]
            lines.append(f"{h['hook']:<22} {h['ok']:>3} {h['errors']:>4} {_ms(lat['p50'])} {_ms(lat['p95'])} "
                         f"{_ms(lat['max'])}")
        self.out({**r, "via": via}, "\n".join(lines))
        if any(h["errors"] for h in r["hooks"]):
            sys.exit(1)

    def _prewarm(self, name=None, wait=None, **_):
        from asgiref.sync import async_to_sync

        from plugins_app.services import prewarm as prewarm_service

        r = async_to_sync(prewarm_service.prewarm)(name, _actor(), wait)
        self.out(r, "\n".join(prewarm_lines(r)))
        if not r["warmed_everywhere"]:
            sys.exit(1)

    def _registry_search(self, query="", registry=None, **_):
        from plugins_app.selectors import registries

        r = registries.search(query, registry)
        lines = [f"{r['registry']} ({r['total']} found{', signed index' if r['signed'] else ''})"]
        for p in r["results"]:
            lines.append(f"  {p['name']:<24} {p['version']:<10} {'installed' if p['installed'] else '':<10} "
                         f"{p['description']}")
        self.out(r, "\n".join(lines))

    def _update_check(self, name, **_):
        r = plugin_service.update_check(name)
        self.out(r, f"{name}: installed {r['installed_version']}, source has {r['available_version']}: "
                    + ("update available" if r["update_available"] else "up to date"))

    @staticmethod
    def _read_input(raw: str) -> dict:
        try:
            text = sys.stdin.read() if raw == "-" else Path(raw[1:]).read_text() if raw.startswith("@") else raw
            data = json.loads(text)
        except (OSError, ValueError) as exc:
            raise CommandError(f"--input is not valid JSON: {exc}", returncode=2) from exc
        if not isinstance(data, dict):
            raise CommandError("--input must be a JSON object", returncode=2)
        return data


def prewarm_lines(r: dict) -> list[str]:
    """One line per worker and plugin: what the worker confirmed, and the workers that did not answer."""
    lines = [f"prewarm {', '.join(r['plugins']) or '(no enabled plugin)'}: {len(r['workers'])} worker(s) answered, "
             f"{len(r['missing'])} did not"]
    if not r["workers"] and not r["missing"]:
        lines.append("  no live worker: nothing was warmed")
    for w in r["workers"]:
        head = f"  {w['host']} pid {w['pid']} ({w['worker']})"
        if w["error"]:
            lines.append(f"{head}: error: {w['error']}")
            continue
        lines.append(f"{head}: zygotes {w['zygote_pids'] or 'none'}")
        for p in w["plugins"]:
            parts = [f"warmed {', '.join(p['warmed'])}" if p["warmed"] else "nothing warmed"]
            parts += [f"{h}: {why}" for h, why in {**p["skipped"], **p["failed"]}.items()]
            lines.append(f"    {p['plugin']}: " + "; ".join(parts))
    for m in r["missing"]:
        lines.append(f"  {m['host']} pid {m['pid']} ({m['worker']}): no answer, not warmed")
    return lines


def _ms(v) -> str:
    return f"{v:>9.1f}" if v is not None else f"{'-':>9}"


def _benchmark_runner():
    """Through a worker when one is alive (as the API does), else each run in this process."""
    from asgiref.sync import async_to_sync, sync_to_async

    from plugins_app import bus
    from plugins_app.services.engine import get_engine

    try:
        workers = async_to_sync(bus.live_workers)()
    except Exception:
        workers = []
    if workers:
        return None, f"via worker ({len(workers)} alive)"

    def one(name, hook, request, timeout):
        attempt = get_engine().test_hook(name, hook, request)
        return {**attempt.result.to_dict(), "trace_id": attempt.trace_id}
    return sync_to_async(one), "in-process (no live worker)"


def _run_test_hook(name: str, hook: str, request: dict, timeout: float | None) -> tuple[dict, str]:
    from asgiref.sync import async_to_sync

    from plugins_app import bus
    from plugins_app.services import hooks as hook_service

    timeout = timeout or plugin_selectors.hook_timeout_secs(name, hook)
    try:
        workers = async_to_sync(bus.live_workers)()
    except Exception:
        workers = []
    if workers:
        reply = async_to_sync(hook_service.test_hook)(name, hook, request, timeout)
        return reply, f"via worker ({len(workers)} alive)"
    from plugins_app.services.engine import get_engine

    attempt = get_engine().test_hook(name, hook, request)
    try:
        from plugins_app.services.engine import invocation_sink

        invocation_sink().flush()
    except Exception:
        pass
    return {**attempt.result.to_dict(), "trace_id": attempt.trace_id}, "in-process (no live worker)"
