"""Plugin lifecycle from the CLI: list, show, scaffold, reload, enable/disable, install, uninstall, update,
update-check, install-deps, use, export, state and registry-search, each a thin call of the service or selector the
dashboard and the API use."""

from __future__ import annotations

import sys
from pathlib import Path

from django.core.management.base import CommandError

from plugins_app import bus
from plugins_app.management.plugin_actions.common import Cli, actor, installed
from plugins_app.selectors import plugins as plugin_selectors
from plugins_app.services import plugins as plugin_service


def list_plugins(cmd: Cli, **_) -> None:
    items = [p.to_dict() for p in plugin_selectors.list_plugins()]
    if cmd.as_json:
        return cmd.out(items)
    if not items:
        return cmd.out(items, "no plugins installed")
    lines = [f"{'NAME':<24} {'RUNTIME':<8} {'STATE':<9} {'VALID':<6} HOOKS"]
    for p in items:
        hooks = ",".join(h for h, s in p["hooks"].items() if s) or "-"
        lines.append(f"{p['name']:<24} {p['runtime']:<8} {'enabled' if p['enabled'] else 'disabled':<9} "
                     f"{'yes' if p['valid'] and p['hooks_valid'] else 'NO':<6} {hooks}")
    cmd.out(items, "\n".join(lines))


def show(cmd: Cli, name, **_) -> None:
    cmd.out(installed(name).to_dict())


def scaffold(cmd: Cli, name, runtime, description, hooks, **_) -> None:
    s = plugin_service.scaffold_plugin(name, description, runtime, hooks, actor=actor())
    cmd.out(s.to_dict(), f"created {s.name} ({s.runtime}) in {s.path}")


def reload(cmd: Cli, name, **_) -> None:
    r = plugin_service.reload_plugin(name, actor=actor())
    cmd.out(r, f"reloaded {name} {r['version']}: hooks {', '.join(r['hooks']) or '-'}, "
               f"timeout {r['hook_timeout_secs']:g}s")


def enable(cmd: Cli, name, **_) -> None:
    r = plugin_service.set_enabled(name, True, actor=actor())
    cmd.out(r, r["message"])


def disable(cmd: Cli, name, **_) -> None:
    r = plugin_service.set_enabled(name, False, actor=actor())
    cmd.out(r, r["message"])


def install(cmd: Cli, source=None, ref=None, registry=None, name=None, **_) -> None:
    if registry or (name and not source):
        body = {"source": "registry", "name": name, "registry": registry, "ref": ref}
    elif source and Path(source).expanduser().is_dir():
        body = {"source": "local", "path": str(Path(source).expanduser().resolve())}
    elif source:
        body = {"source": "git", "url": source, "ref": ref}
    else:
        raise CommandError("give a local directory, a git URL, or --registry/--name", returncode=2)
    r = plugin_service.install_plugin({k: v for k, v in body.items() if v is not None}, actor=actor())
    cmd.out(r, f"installed {r['name']} {r['version']} into {r['path']}")


def uninstall(cmd: Cli, name, **_) -> None:
    r = plugin_service.uninstall_plugin(name, actor=actor())
    cmd.out(r, f"removed {name}" + (" (it was in the active chain)" if r.get("was_active") else ""))


def update(cmd: Cli, name, force=False, **_) -> None:
    r = plugin_service.update_plugin(name, force, actor=actor())
    cmd.out(r, f"updated {name}: {r.get('previous_version') or '?'} -> {r['version']}")


def update_check(cmd: Cli, name, **_) -> None:
    r = plugin_service.update_check(name)
    cmd.out(r, f"{name}: installed {r['installed_version']}, source has {r['available_version']}: "
               + ("update available" if r["update_available"] else "up to date"))


def install_deps(cmd: Cli, name, **_) -> None:
    # through a worker when one is alive (as the API does), else in this process
    r = plugin_service.install_deps(name, actor=actor(), via_worker=bus.worker_alive())
    cmd.out(r, str(r.get("output") or r.get("message") or "dependencies installed"))


def use(cmd: Cli, names, **_) -> None:
    r = plugin_service.set_engine_config(names[0] if len(names) == 1 else None,
                                         names if len(names) > 1 else None, actor=actor())
    cmd.out(r, f"context engine: {r['mode']} {' -> '.join(r['chain']) if r['chain'] else '(default engine)'}")


def export(cmd: Cli, name, output=None, **_) -> None:
    data = plugin_service.export_plugin(name, actor=actor())
    if output == "-":
        sys.stdout.buffer.write(data)
        return
    path = Path(output or f"{name}.tar.gz")
    path.write_bytes(data)
    cmd.out({"plugin": name, "path": str(path.resolve()), "bytes": len(data)}, f"wrote {path} ({len(data)} bytes)")


def state(cmd: Cli, name, wipe=False, **_) -> None:
    from plugins_app.selectors.plugin_data import plugin_state

    if wipe:
        r = plugin_service.wipe_state(name, actor=actor())
        return cmd.out(r, f"wiped {r['path']}: {r['files_removed']} files, {r['bytes_freed']} bytes")
    installed(name)
    r = plugin_state(name)
    lines = [f"{r['path']}: {r['file_count']} files, {r['size_bytes']} bytes"]
    lines += [f"  {f['size_bytes']:>10}  {f['path']}" for f in r["files"]]
    cmd.out(r, "\n".join(lines))


def registry_search(cmd: Cli, query="", registry=None, **_) -> None:
    from plugins_app.selectors import registries

    r = registries.search(query, registry)
    lines = [f"{r['registry']} ({r['total']} found{', signed index' if r['signed'] else ''})"]
    for p in r["results"]:
        lines.append(f"  {p['name']:<24} {p['version']:<10} {'installed' if p['installed'] else '':<10} "
                     f"{p['description']}")
    cmd.out(r, "\n".join(lines))
