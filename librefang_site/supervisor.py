"""The process supervisor behind `librefang start`: one daphne and N workers, each a `Child` in one of six named
states (after supervisord's process states). `ALLOWED` lists every transition; `Supervisor._become` refuses others.

    stopped ──start──▶ starting ──up START_SECS──▶ running
    starting, running ──exits──▶ backoff ──its delay is over──▶ starting
    starting ──exits, the GIVE_UP_AFTER-th failed start in a row──▶ fatal ──SIGUSR1──▶ starting
    starting, running ──SIGINT/SIGTERM──▶ stopping ──exits──▶ stopped;   backoff, fatal ──SIGINT/SIGTERM──▶ stopped

The rules they keep (README.md, "Two commands"):
- A child that exits is started again after 0.5 s, doubling up to 30 s, back to 0.5 s once it had stayed up 60 s,
  whatever its role: a dead worker never stops the web tier, and while daphne restarts new connections wait in the
  backlog of the listening socket the supervisor holds for it.
- A start fails when the child exits within START_SECS of it. After GIVE_UP_AFTER failed starts in a row the child
  is given up (`fatal`): left alone, its cause shown on the dashboard and in /api/health, until SIGUSR1 (the workers
  page's "Start again" sends it) starts every given-up child again. A web child that gives up stops everything, as
  nothing could serve the dashboard or the API: the supervisor exits 1.
- SIGINT/SIGTERM stop everything: SIGTERM to daphne first (it stops accepting and answers what it holds), then to
  the workers (they finish the jobs in flight), SIGKILL for whatever is still there after STOP_SECS, and finally
  every process left in a child's process group. A second SIGINT/SIGTERM skips the waiting.
- Each exit is logged at the level its cause deserves (librefang_site/child_exit.py: SIGKILL flagged as a possible
  out-of-memory kill); signal handlers only set flags.

Time comes from an injected `Clock`, so tests drive `tick` without sleeping. Every moment is kept on its monotonic
clock and turned into Unix time only for the status file, `$LIBREFANG_HOME/run/supervisor.json` (mode 0600),
written atomically on every change and every 2 s; `plugins_app/selectors/supervisor.py` reads it for the health
endpoint and the dashboard.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from engine.process import data_disks
from librefang_site import child_exit
from librefang_site.child_exit import Exit

log = logging.getLogger("librefang.supervisor")

BACKOFF_FIRST_SECS = 0.5
BACKOFF_MAX_SECS = 30.0
STABLE_AFTER_SECS = 60.0  # a child that ran this long restarts after BACKOFF_FIRST_SECS again
START_SECS = 10.0  # a child that exits sooner failed its start
GIVE_UP_AFTER = 6  # failed starts in a row (0.5 + 1 + 2 + 4 + 8 s of backoff between them), then fatal
WEB_STOP_SECS = 8.0  # daphne's share of the shutdown bound
STOP_SECS = 20.0  # after this, SIGKILL
STATUS_EVERY_SECS = 2.0
POLL_SECS = 0.1
STATUS_FILE = Path("run") / "supervisor.json"
START_AGAIN_SIGNAL = signal.SIGUSR1  # not SIGHUP: a closed terminal must still stop `make run`


class State(StrEnum):
    STOPPED = "stopped"  # not started yet, or stopped with the service
    STARTING = "starting"  # started less than START_SECS ago
    RUNNING = "running"
    BACKOFF = "backoff"  # exited; started again once its delay is over
    FATAL = "fatal"  # given up after GIVE_UP_AFTER failed starts in a row
    STOPPING = "stopping"  # sent SIGTERM by the shutdown


ALLOWED: dict[State, frozenset[State]] = {
    State.STOPPED: frozenset({State.STARTING}),
    # a child that cannot even be forked goes from starting to backoff (or fatal) at once
    State.STARTING: frozenset({State.RUNNING, State.BACKOFF, State.FATAL, State.STOPPING}),
    State.RUNNING: frozenset({State.BACKOFF, State.STOPPING}),
    State.BACKOFF: frozenset({State.STARTING, State.STOPPED}),
    State.FATAL: frozenset({State.STARTING, State.STOPPED}),
    State.STOPPING: frozenset({State.STOPPED}),
}
HAS_PROCESS = frozenset({State.STARTING, State.RUNNING, State.STOPPING})


class TransitionError(RuntimeError):
    """A state change ALLOWED does not list: a bug in the supervisor, never a child's doing."""


@dataclass(frozen=True)
class RestartPolicy:
    first_delay: float = BACKOFF_FIRST_SECS
    max_delay: float = BACKOFF_MAX_SECS
    stable_after: float = STABLE_AFTER_SECS
    start_secs: float = START_SECS
    give_up_after: int = GIVE_UP_AFTER

    def next_delay(self, previous: float, up: float) -> float:
        """The first delay for a first exit or after a child stayed up `stable_after`; else twice the last, capped."""
        if not previous or up >= self.stable_after:
            return self.first_delay
        return min(previous * 2, self.max_delay)


class Clock:
    """Time as the supervisor reads it: moments on the monotonic clock (`now`), Unix time only to show one."""

    def now(self) -> float:
        return time.monotonic()

    def wall(self, moment: float) -> float:
        return time.time() - (time.monotonic() - moment)

    def sleep(self, secs: float) -> None:
        time.sleep(secs)


@dataclass
class Child:
    role: str  # "web" | "worker"
    index: int
    argv: list[str]
    pass_fds: tuple[int, ...] = ()  # the listening socket, for daphne
    state: State = State.STOPPED
    proc: subprocess.Popen | None = None
    started: float | None = None  # moments, on the supervisor's clock
    exited: float | None = None
    due: float | None = None  # when a child in backoff starts again
    delay: float = 0.0  # its current backoff
    restarts: int = 0
    failed_starts: int = 0  # in a row; back to 0 once a start succeeds
    last_exit: Exit | None = None  # the last exit nobody asked for

    @property
    def name(self) -> str:
        return "web" if self.role == "web" else f"worker {self.index}"

    def reap(self) -> Exit | None:
        """How its process ended, once it has (None while it runs)."""
        if self.proc is None or self.proc.poll() is None:
            return None
        return child_exit.from_returncode(self.proc.pid, self.proc.returncode)


def status_path(home: Path) -> Path:
    return home / STATUS_FILE


def die_with_parent() -> None:
    """preexec_fn: the child gets SIGTERM if the supervisor dies without stopping it (SIGKILL, crash)."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)


class Supervisor:
    def __init__(self, children: list[Child], *, env: dict[str, str], home: Path, listener=None,
                 policy: RestartPolicy | None = None, clock: Clock | None = None):
        self.children = children
        self.env = env
        self.listener = listener  # our copy of daphne's listening socket (closed when stopping)
        self.policy = policy or RestartPolicy()
        self.clock = clock or Clock()
        self.home = home
        self.status_file = status_path(home)
        self.began = self.clock.now()
        self.stopping = False
        self.stop_signal: int | None = None  # set by the signal handlers, acted on by the loop
        self.force = False  # a second SIGINT/SIGTERM: stop waiting
        self.start_again = False  # SIGUSR1
        self._status_at: float | None = None

    # ---- running ----

    def run(self) -> int:
        """Serve until SIGINT/SIGTERM (then 0) or until the web child gives up (then 1)."""
        signal.signal(signal.SIGINT, self._on_stop_signal)
        signal.signal(signal.SIGTERM, self._on_stop_signal)
        signal.signal(START_AGAIN_SIGNAL, self._on_start_again_signal)
        self.start_all()
        while self.stop_signal is None and not self.web_gave_up():
            if self.start_again:
                self.start_again = False
                self.start_given_up()
            self.tick()
            self.clock.sleep(POLL_SECS)
        return self.shutdown()

    def start_all(self) -> None:
        self.status_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        now = self.clock.now()
        for child in self.children:
            self._spawn(child, now)
        self._write_status(now)

    def tick(self) -> None:
        """One look at every child; the status file is rewritten on a change and every STATUS_EVERY_SECS."""
        now = self.clock.now()
        changed = [self._step(child, now) for child in self.children]
        if any(changed) or self._status_due(now):
            self._write_status(now)

    def _step(self, child: Child, now: float) -> bool:
        """The transitions that exits and time make (the shutdown and SIGUSR1 make the others); True on a change."""
        if child.state in (State.STARTING, State.RUNNING):
            exit_ = child.reap()
            if exit_ is not None:
                self._exited(child, exit_, now)
                return True
            if child.state is State.STARTING and now - child.started >= self.policy.start_secs:
                self._become(child, State.RUNNING)
                child.failed_starts = 0
                log.info("%s (pid %d) is running: up %g s", child.name, child.proc.pid, self.policy.start_secs)
                return True
        elif child.state is State.BACKOFF and now >= child.due:
            child.restarts += 1
            self._spawn(child, now)
            return True
        return False

    def _spawn(self, child: Child, now: float) -> None:
        self._become(child, State.STARTING)
        child.started, child.due = now, None
        try:
            child.proc = subprocess.Popen(child.argv, env=self.env, process_group=0, preexec_fn=die_with_parent,
                                          pass_fds=child.pass_fds)
        except OSError as exc:  # no fork, no exec: a failed start like any other
            child.proc = None
            self._exited(child, child_exit.not_started(exc), now)
            return
        again = f", restart #{child.restarts}" if child.restarts else ""
        log.info("%s started (pid %d%s)", child.name, child.proc.pid, again)

    def _exited(self, child: Child, exit_: Exit, now: float) -> None:
        """A child ended without being asked: it starts again after its backoff, or is given up."""
        up = now - child.started
        child.last_exit, child.exited = exit_, now
        if exit_.pid is not None:
            _kill_group(exit_.pid)  # hooks or helpers the dead child left in its process group
        child.failed_starts = child.failed_starts + 1 if up < self.policy.start_secs else 0
        what = (f"{child.name} {exit_.cause}" if exit_.pid is None else
                f"{child.name} (pid {exit_.pid}) exited with {exit_.cause} after {up:.1f} s")
        if child.failed_starts >= self.policy.give_up_after:
            self._become(child, State.FATAL)
            then = ("nothing can serve the dashboard or the API" if child.role == "web" else
                    f"fix the cause, then press Start again on the workers page or send SIGUSR1 to pid {os.getpid()}")
            log.critical("%s; given up after %d failed starts in a row (each within %g s of its start): %s", what,
                         child.failed_starts, self.policy.start_secs, then)
            return
        child.delay = self.policy.next_delay(child.delay, up)
        child.due = now + child.delay
        self._become(child, State.BACKOFF)
        log.log(exit_.level, "%s; restarting in %g s (restart #%d)", what, child.delay, child.restarts + 1)

    def _become(self, child: Child, state: State) -> None:
        if state not in ALLOWED[child.state]:
            raise TransitionError(f"{child.name}: {child.state} -> {state}")
        log.debug("%s: %s -> %s", child.name, child.state, state)
        child.state = state

    def web_gave_up(self) -> bool:
        return any(child.role == "web" and child.state is State.FATAL for child in self.children)

    def start_given_up(self) -> list[Child]:
        """SIGUSR1: every given-up child starts again, its failed starts counted from 0."""
        now = self.clock.now()
        given_up = [child for child in self.children if child.state is State.FATAL]
        if not given_up:
            log.info("%s: no child has given up; nothing to start", START_AGAIN_SIGNAL.name)
        for child in given_up:
            log.warning("%s: starting %s again (given up after %d failed starts: %s)", START_AGAIN_SIGNAL.name,
                        child.name, child.failed_starts, child.last_exit.cause)
            child.failed_starts, child.delay = 0, 0.0
            child.restarts += 1
            self._spawn(child, now)
        self._write_status(now)
        return given_up

    def _on_stop_signal(self, signum, frame) -> None:
        if self.stop_signal is not None:
            self.force = True
        self.stop_signal = self.stop_signal or signum

    def _on_start_again_signal(self, signum, frame) -> None:
        self.start_again = True

    # ---- stopping ----

    def shutdown(self) -> int:
        """Stops every child, web first; 0, or 1 when it stops because the web child gave up."""
        web_gave_up = self.web_gave_up()
        why = (signal.Signals(self.stop_signal).name if self.stop_signal else
               "web given up" if web_gave_up else "stop requested")
        log.info("%s: stopping (web first, then workers; SIGKILL after %g s)", why, STOP_SECS)
        self.stopping = True
        began = self.clock.now()
        for child in self.children:
            if child.state in (State.BACKOFF, State.FATAL):
                child.due = None
                self._become(child, State.STOPPED)
        if self.listener is not None:
            self.listener.close()  # daphne's own copy closes when it stops accepting
        web = [child for child in self.children if child.role == "web"]
        self._terminate(web)
        self._wait(web, began + WEB_STOP_SECS)
        self._terminate([child for child in self.children if child.role != "web"])
        self._wait(self.children, began + STOP_SECS)
        for child in self.children:
            if child.state is State.STOPPING:
                log.warning("%s (pid %d) still running after %.1f s; SIGKILL", child.name, child.proc.pid,
                            self.clock.now() - began)
                child.proc.kill()
                child.proc.wait()
                self._stopped(child)
        for child in self.children:
            if child.proc is not None:
                _kill_group(child.proc.pid)  # anything the child left in its process group
        data_disks.release_all(self.home / "plugin_data")  # no mount of ours outlives the service (their images stay)
        self.status_file.unlink(missing_ok=True)
        log.info("stopped in %.1f s", self.clock.now() - began)
        return 1 if web_gave_up else 0

    def _terminate(self, children: list[Child]) -> None:
        for child in children:
            if child.state in (State.STARTING, State.RUNNING):
                self._become(child, State.STOPPING)
                try:
                    child.proc.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass

    def _wait(self, children: list[Child], deadline: float) -> None:
        """Until every stopping child among `children` has exited, the deadline, or a second signal."""
        while True:
            now = self.clock.now()
            for child in children:
                if child.state is State.STOPPING and child.reap() is not None:
                    self._stopped(child)
            if self.force or now >= deadline or not any(c.state is State.STOPPING for c in children):
                return
            if self._status_due(now):
                self._write_status(now)
            self.clock.sleep(POLL_SECS)

    def _stopped(self, child: Child) -> None:
        exit_ = child.reap()
        self._become(child, State.STOPPED)
        log.log(logging.INFO if exit_.deliberate else logging.WARNING, "%s (pid %d) stopped with %s", child.name,
                exit_.pid, exit_.words)

    # ---- status file ----

    def status(self, now: float) -> dict:
        wall = self.clock.wall
        return {"pid": os.getpid(), "host": socket.gethostname(), "started_at": wall(self.began),
                "updated_at": wall(now), "stopping": self.stopping, "start_again_signal": START_AGAIN_SIGNAL.name,
                "children": [self._child_status(child) for child in self.children]}

    def _child_status(self, child: Child) -> dict:
        wall = self.clock.wall
        return {"slot": child.name, "role": child.role, "index": child.index,
                "pid": child.proc.pid if child.state in HAS_PROCESS else None, "state": child.state.value,
                "started_at": None if child.started is None else wall(child.started),
                "restarts": child.restarts, "failed_starts": child.failed_starts,
                "last_exit": child.last_exit.as_dict() if child.last_exit else None,
                "last_exit_at": None if child.exited is None else wall(child.exited),
                "next_restart_at": wall(child.due) if child.state is State.BACKOFF else None}

    def _status_due(self, now: float) -> bool:
        return self._status_at is None or now - self._status_at >= STATUS_EVERY_SECS

    def _write_status(self, now: float) -> None:
        self._status_at = now
        write_json_atomic(self.status_file, self.status(now))


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
