"""Start again what the `librefang start` supervisor gave up (librefang_site/supervisor.py): the workers page's
"Start again" button.

The supervisor names in its status file the signal that makes it start every given-up child again. Only the web
process that supervisor started sends it, and only to its own parent: the status file's pid must be this process's
parent, so a stale file or a reused pid never receives a signal.
"""

from __future__ import annotations

import os
import signal

from engine.errors import ServiceError
from plugins_app.selectors.supervisor import given_up, supervisor_status
from plugins_app.services import audit

START_AGAIN_SIGNALS = frozenset({"SIGUSR1", "SIGUSR2"})  # a status file naming SIGTERM or SIGKILL is not obeyed


def start_given_up_again(actor: str) -> list[str]:
    """Asks the supervisor to start its given-up children again; returns their names."""
    doc = supervisor_status()
    if doc is None:
        raise ServiceError("no_supervisor", "No `librefang start` supervisor runs this service: start the process "
                                            "that stopped by hand (under systemd: systemctl reset-failed, then "
                                            "systemctl start).", 409)
    names = [child.get("slot", "?") for child in given_up(doc)]
    if not names:
        raise ServiceError("nothing_given_up", "The supervisor has given up nothing: every process is running or "
                                               "restarting by itself.", 409)
    pid, name = doc["pid"], doc.get("start_again_signal")
    if name not in START_AGAIN_SIGNALS:
        raise ServiceError("cannot_start_again", "This supervisor cannot be asked to start a process again: restart "
                                                 "`librefang start`.", 409)
    if pid != os.getppid():
        raise ServiceError("not_our_supervisor", f"This web process was not started by the supervisor (pid {pid}): "
                                                 f"on its host, run `kill -{name.removeprefix('SIG')} {pid}`.", 409)
    os.kill(pid, signal.Signals[name])
    audit.record(actor, "supervisor.start_again", ", ".join(names), details={"pid": pid, "signal": name})
    return names
