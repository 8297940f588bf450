"""The process supervisor behind `librefang start`: one daphne and N workers, each restarted when it exits.

A child that exits is restarted after a capped exponential backoff (0.5 s doubling to 30 s, back to 0.5 s once a
child stayed up 60 s), whatever its role: a dead worker never stops the web tier, and while daphne itself restarts
new connections wait in the backlog of the listening socket the supervisor holds for it. Only SIGINT/SIGTERM stop
everything: SIGTERM to daphne first (it stops accepting and answers what it holds), then to the workers (they
finish the jobs in flight), SIGKILL for whatever is still there after a bound, and finally every process left in
a child's process group. A second SIGINT/SIGTERM skips the waiting.

The state is written atomically to `$LIBREFANG_HOME/run/supervisor.json` (mode 0600) on every change and every
2 s; `plugins_app/selectors/supervisor.py` reads it for the health endpoint and the dashboard.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from engine.process import data_disks

BACKOFF_FIRST_SECS = 0.5
BACKOFF_MAX_SECS = 30.0
STABLE_AFTER_SECS = 60.0  # a child that ran this long restarts after BACKOFF_FIRST_SECS again
WEB_STOP_SECS = 8.0  # daphne's share of the shutdown bound
STOP_SECS = 20.0  # after this, SIGKILL
STATUS_EVERY_SECS = 2.0
POLL_SECS = 0.1
STATUS_FILE = Path("run") / "supervisor.json"


def status_path(home: Path) -> Path:
    return home / STATUS_FILE


def describe_exit(returncode: int) -> tuple[int | None, str | None, str]:
    """(code, signal name, words) for a Popen return code (negative = killed by that signal)."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return None, name, name
    return returncode, None, f"code {returncode}"


def die_with_parent() -> None:
    """preexec_fn: the child gets SIGTERM if the supervisor dies without stopping it (SIGKILL, crash)."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)


@dataclass
class Slot:
    role: str  # "web" | "worker"
    index: int
    argv: list[str]
    pass_fds: tuple[int, ...] = ()  # the listening socket, for daphne
    proc: subprocess.Popen | None = None
    started_at: float | None = None  # wall clock, for people
    started_mono: float = 0.0
    restarts: int = 0
    backoff: float = 0.0
    last_exit: dict | None = None
    last_exit_at: float | None = None
    restart_due: float | None = None  # monotonic
    next_restart_at: float | None = None  # wall clock, for people

    @property
    def name(self) -> str:
        return "web" if self.role == "web" else f"worker {self.index}"

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def as_dict(self) -> dict:
        alive = self.running()
        state = "running" if alive else ("restarting" if self.restart_due is not None else "stopped")
        return {"slot": self.name, "role": self.role, "index": self.index,
                "pid": self.proc.pid if alive else None, "state": state, "started_at": self.started_at,
                "restarts": self.restarts, "last_exit": self.last_exit, "last_exit_at": self.last_exit_at,
                "next_restart_at": self.next_restart_at}


class Supervisor:
    def __init__(self, slots: list[Slot], *, env: dict[str, str], home: Path, listener=None, log=None):
        self.slots = slots
        self.listener = listener  # our copy of daphne's listening socket (closed when stopping)
        self.env = env
        self.home = home
        self.status_file = status_path(home)
        self.started_at = time.time()
        self.stop_signal: int | None = None
        self.force = False
        self._log = log or (lambda msg: print(f"{time.strftime('%H:%M:%S')} librefang: {msg}", file=sys.stderr,
                                              flush=True))
        self._last_status = 0.0
        self._reported: set[int] = set()

    # ---- running ----

    def run(self) -> int:
        """Serve until SIGINT/SIGTERM; returns 0 after a clean stop."""
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGTERM, self._on_signal)
        self.status_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        for slot in self.slots:
            self._spawn(slot)
        self._write_status()
        while self.stop_signal is None:
            self.tick()
            time.sleep(POLL_SECS)
        return self.shutdown()

    def tick(self) -> None:
        now = time.monotonic()
        changed = False
        for slot in self.slots:
            if slot.proc is not None and slot.restart_due is None and slot.proc.poll() is not None:
                self._on_exit(slot, now)
                changed = True
            elif slot.restart_due is not None and now >= slot.restart_due and self.stop_signal is None:
                slot.restarts += 1
                self._spawn(slot)
                changed = True
        if changed or now - self._last_status >= STATUS_EVERY_SECS:
            self._write_status()

    def _spawn(self, slot: Slot) -> None:
        slot.proc = subprocess.Popen(slot.argv, env=self.env, process_group=0, preexec_fn=die_with_parent,
                                     pass_fds=slot.pass_fds)
        slot.started_at, slot.started_mono = time.time(), time.monotonic()
        slot.restart_due = slot.next_restart_at = None
        again = f", restart #{slot.restarts}" if slot.restarts else ""
        self._log(f"{slot.name} started (pid {slot.proc.pid}{again})")

    def _on_exit(self, slot: Slot, now: float) -> None:
        proc = slot.proc
        self._reported.add(proc.pid)
        code, signame, words = describe_exit(proc.returncode)
        slot.last_exit = {"code": code, "signal": signame, "pid": proc.pid}  # reaped: the dashboard shows it dead
        slot.last_exit_at = time.time()
        _kill_group(proc.pid)  # hooks or helpers the dead child left in its process group
        stable = now - slot.started_mono >= STABLE_AFTER_SECS
        slot.backoff = BACKOFF_FIRST_SECS if stable or not slot.backoff else min(slot.backoff * 2, BACKOFF_MAX_SECS)
        slot.restart_due = now + slot.backoff
        slot.next_restart_at = time.time() + slot.backoff
        self._log(f"{slot.name} (pid {proc.pid}) exited with {words}; restarting in {slot.backoff:g} s "
                  f"(restart #{slot.restarts + 1})")

    def _on_signal(self, signum, frame) -> None:
        if self.stop_signal is not None:
            self.force = True
            return
        self.stop_signal = signum

    # ---- stopping ----

    def shutdown(self) -> int:
        name = signal.Signals(self.stop_signal).name if self.stop_signal else "request"
        self._log(f"{name}: stopping (web first, then workers; SIGKILL after {STOP_SECS:g} s)")
        started = time.monotonic()
        for slot in self.slots:
            slot.restart_due = slot.next_restart_at = None
        web = [s for s in self.slots if s.role == "web"]
        workers = [s for s in self.slots if s.role != "web"]
        if self.listener is not None:
            self.listener.close()  # daphne's own copy closes when it stops accepting
        self._terminate(web)
        self._wait(web, started + WEB_STOP_SECS)
        self._terminate(workers)
        self._wait(self.slots, started + STOP_SECS)
        for slot in self.slots:
            if slot.running():
                self._log(f"{slot.name} (pid {slot.proc.pid}) still running after "
                          f"{time.monotonic() - started:.1f} s; SIGKILL")
                slot.proc.kill()
                slot.proc.wait()
        for slot in self.slots:
            if slot.proc is not None:
                _kill_group(slot.proc.pid)  # anything the child left in its process group
        data_disks.release_all(self.home / "plugin_data")  # no mount of ours outlives the service (their images stay)
        try:
            self.status_file.unlink()
        except FileNotFoundError:
            pass
        self._log(f"stopped in {time.monotonic() - started:.1f} s")
        return 0

    def _terminate(self, slots: list[Slot]) -> None:
        for slot in slots:
            if slot.running():
                try:
                    slot.proc.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass

    def _wait(self, slots: list[Slot], deadline: float) -> None:
        while not self.force and time.monotonic() < deadline and any(s.running() for s in slots):
            if time.monotonic() - self._last_status >= STATUS_EVERY_SECS:
                self._write_status()
            time.sleep(POLL_SECS)
        for slot in slots:
            if slot.proc is not None and slot.proc.poll() is not None and slot.proc.pid not in self._reported:
                self._reported.add(slot.proc.pid)
                self._log(f"{slot.name} (pid {slot.proc.pid}) stopped with {describe_exit(slot.proc.returncode)[2]}")

    # ---- status file ----

    def status(self) -> dict:
        return {"pid": os.getpid(), "host": socket.gethostname(), "started_at": self.started_at, "updated_at": time.time(),
                "stopping": self.stop_signal is not None, "children": [s.as_dict() for s in self.slots]}

    def _write_status(self) -> None:
        self._last_status = time.monotonic()
        write_json_atomic(self.status_file, self.status())


def write_json_atomic(path: Path, doc: dict) -> None:
    """Readers see the old file or the new one, never half of one; owner-only from the first byte."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(doc, fh)
    os.replace(tmp, path)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
