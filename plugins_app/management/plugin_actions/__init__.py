"""The actions of `librefang plugin …` (plugins_app/management/commands/plugin.py parses the arguments, handles
errors and formats output; each action here gets that command as `cmd`):

- common.py   who acts (the audit actor), an installed plugin or exit 3, --input JSON
- manage.py   list, show, scaffold, reload, enable, disable, install, uninstall, update, update-check, install-deps,
              use, export, state, registry-search
- checks.py   doctor, lint (exit 1 on problems)
- runs.py     test-hook, benchmark, prewarm: through a live worker when one is heartbeating, else in this process
- permissions.py  permissions, approve: what a plugin asks beyond the defaults, and an owner's approval of it
"""

from plugins_app.management.plugin_actions import checks, manage, permissions, runs

ACTIONS = {
    "list": manage.list_plugins, "show": manage.show, "scaffold": manage.scaffold, "reload": manage.reload,
    "enable": manage.enable, "disable": manage.disable, "install": manage.install, "uninstall": manage.uninstall,
    "update": manage.update, "update-check": manage.update_check, "install-deps": manage.install_deps,
    "use": manage.use, "export": manage.export, "state": manage.state, "registry-search": manage.registry_search,
    "doctor": checks.doctor, "lint": checks.lint,
    "test-hook": runs.test_hook, "benchmark": runs.benchmark, "prewarm": runs.prewarm,
    "permissions": permissions.show, "approve": permissions.approve,
}

__all__ = ["ACTIONS"]
