"""`librefang plugin permissions <name>` (what the plugin asks beyond the defaults, what changed since its last
approved version, what its hooks get now) and `librefang plugin approve <name>` (an owner's approval of the
plugin.toml on disk, like the dashboard's Approve button)."""

from __future__ import annotations

from typing import Any

from plugins_app.management.plugin_actions.common import Cli, actor, installed
from plugins_app.selectors import permissions as perm_selectors
from plugins_app.services import permissions as perm_service


def show(cmd: Cli, name, **_) -> None:
    installed(name)
    view = perm_selectors.permissions(name)
    cmd.out(view, describe(view))


def approve(cmd: Cli, name, sha256=None, **_) -> None:
    installed(name)
    view = perm_service.approve(name, actor(), expected_sha256=sha256)
    cmd.out(view, describe(view) + f"\napproved {name} (plugin.toml sha256 {view['manifest_sha256'][:12]}…)")


def describe(view: dict[str, Any]) -> str:
    """The view as text: asks, approval state, changes since the last approved version, the diff, the grant."""
    name = view["plugin"]
    if not view["valid"]:
        return f"{name}: {view['error']}"
    lines = [f"{name}: plugin.toml sha256 {view['manifest_sha256'][:12]}…"]
    if view["asks_nothing"]:
        lines.append("asks for nothing beyond the defaults (no approval needed)")
    else:
        state = "approved" if view["approved"] else "NOT APPROVED: its hooks run with the defaults"
        lines.append(f"asks beyond the defaults ({state}):")
        lines += [f"  - {a['label']}" for a in view["asks"]]
    last = view["last_approved"]
    if last and not view["approved"]:
        lines.append(f"last approved version {last['manifest_sha256'][:12]}… by {last['approved_by']} "
                     f"({last['how']}, {last['approved_at']}); since then:")
        lines += [f"  + {a['label']}" for a in view["changes"]["added"]]
        lines += [f"  - {a['label']}" for a in view["changes"]["removed"]]
    if view["manifest_diff"]:
        lines.append(view["manifest_diff"].rstrip("\n"))
    grant = view["effective"]
    if grant:
        lines.append(f"its hooks get now: network {'yes' if grant['network'] else 'no'}, "
                     f"{grant['max_processes']} processes, {grant['max_memory_mb']} MB, "
                     f"{grant['hook_timeout_secs']:g} s per call"
                     + (f", variables {', '.join(grant['env_vars'])}" if grant["env_vars"] else ""))
    return "\n".join(lines)
