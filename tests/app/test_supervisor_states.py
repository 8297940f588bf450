"""The `librefang start` supervisor's state machine (librefang_site/supervisor.py), driven tick by tick: real child
processes, and a clock the test moves instead of sleeping."""

from __future__ import annotations

import json
import logging
import os
import signal
import stat
import sys
import time

import pytest

from librefang_site.supervisor import (
    STOP_SECS,
    Child,
    Clock,
    RestartPolicy,
    State,
    Supervisor,
    TransitionError,
)
from tests.waiting import pid_gone, wait_until

EPOCH = 1_800_000_000.0
SLEEPER = [sys.executable, "-c", "import time; time.sleep(300)"]
EXIT_3 = [sys.executable, "-c", "import sys; sys.exit(3)"]


class ManualClock(Clock):
    """The supervisor's time, moved by the test. `sleep` moves it too, and lets real time pass for a moment so
    that children signalled by a shutdown can exit meanwhile."""

    def __init__(self) -> None:
        self.t = 1000.0

    def now(self) -> float:
        return self.t

    def wall(self, moment: float) -> float:
        return EPOCH + moment

    def advance(self, secs: float) -> None:
        self.t += secs

    def sleep(self, secs: float) -> None:
        self.t += secs
        time.sleep(0.01)  # real time passing is the point: the real children signalled meanwhile need some to exit


@pytest.fixture
def clock():
    return ManualClock()


@pytest.fixture
def made(tmp_path, clock, caplog):
    """Builds supervisors over real children; every process they started is gone after the test."""
    caplog.set_level(logging.DEBUG, logger="librefang.supervisor")
    built: list[Supervisor] = []

    def make(*children: Child, policy: RestartPolicy | None = None) -> Supervisor:
        sup = Supervisor(list(children), env=dict(os.environ), home=tmp_path / "home", policy=policy, clock=clock)
        built.append(sup)
        return sup

    yield make
    for sup in built:
        for child in sup.children:
            if child.proc is not None and child.proc.poll() is None:
                os.killpg(child.proc.pid, signal.SIGKILL)
                child.proc.wait()


def ended(child: Child) -> None:
    """The child's real process has exited (the supervisor notices on its next tick)."""
    child.proc.wait(timeout=60)


def killed(child: Child, signum: int = signal.SIGKILL) -> int:
    pid = child.proc.pid
    os.kill(pid, signum)
    ended(child)
    return pid


def status_of(sup: Supervisor, name: str) -> dict:
    doc = json.loads(sup.status_file.read_text())
    return next(c for c in doc["children"] if c["slot"] == name)


def messages(caplog, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "librefang.supervisor" and r.levelno == level]


def test_it_doubles_the_restart_delay_to_30_s_and_starts_at_0_5_s_again_after_a_child_stayed_up_60_s(
        made, clock, caplog):
    worker = Child("worker", 1, SLEEPER)
    sup = made(worker)
    sup.start_all()
    delays = []
    for up in (11, 11, 11, 11, 11, 11, 11, 11, 61):
        clock.advance(up)
        sup.tick()
        assert worker.state is State.RUNNING
        killed(worker)
        sup.tick()
        assert worker.state is State.BACKOFF and worker.failed_starts == 0
        delays.append(worker.delay)
        clock.advance(worker.delay - 0.25)
        sup.tick()
        assert worker.state is State.BACKOFF  # not before its delay
        clock.advance(0.25)
        sup.tick()
        assert worker.state is State.STARTING and worker.proc.poll() is None
    assert delays == [0.5, 1, 2, 4, 8, 16, 30, 30, 0.5]
    assert worker.restarts == 9
    errors = messages(caplog, logging.ERROR)
    assert len(errors) == 9 and all("exited with SIGKILL (possibly out of memory) after " in m for m in errors)
    assert errors[0].endswith("restarting in 0.5 s (restart #1)") and errors[6].endswith("in 30 s (restart #7)")


def test_it_gives_up_a_child_that_never_stays_up_and_leaves_the_web_tier_alone(made, clock, caplog):
    web, worker = Child("web", 0, SLEEPER), Child("worker", 1, EXIT_3)
    sup = made(web, worker)
    sup.start_all()
    seen = []
    while worker.state is not State.FATAL:
        ended(worker)
        sup.tick()
        seen.append((worker.state.value, worker.failed_starts, worker.delay))
        if worker.state is State.BACKOFF:
            clock.advance(worker.delay)
            sup.tick()
            assert worker.state is State.STARTING
    assert seen == [("backoff", 1, 0.5), ("backoff", 2, 1), ("backoff", 3, 2), ("backoff", 4, 4), ("backoff", 5, 8),
                    ("fatal", 6, 8)]
    clock.advance(3600)
    sup.tick()
    assert worker.state is State.FATAL and worker.restarts == 5  # never started again by itself
    clock.advance(11)
    sup.tick()
    assert web.state is State.RUNNING and web.restarts == 0 and not sup.web_gave_up()

    shown = status_of(sup, "worker 1")
    assert {k: shown[k] for k in ("state", "pid", "failed_starts", "restarts", "next_restart_at")} == {
        "state": "fatal", "pid": None, "failed_starts": 6, "restarts": 5, "next_restart_at": None}
    assert shown["last_exit"]["code"] == 3 and shown["last_exit"]["cause"] == "code 3"
    assert shown["last_exit_at"] == EPOCH + worker.exited
    assert stat.S_IMODE(sup.status_file.stat().st_mode) == 0o600
    [critical] = messages(caplog, logging.CRITICAL)
    assert critical.startswith("worker 1 (pid ") and " exited with code 3 after " in critical
    assert "; given up after 6 failed starts in a row (each within 10 s of its start)" in critical
    assert f"send SIGUSR1 to pid {os.getpid()}" in critical

    # SIGUSR1 (or the workers page) starts it again, its failed starts counted from 0
    assert sup.start_given_up() == [worker]
    assert worker.state is State.STARTING and worker.failed_starts == 0 and worker.restarts == 6
    ended(worker)
    sup.tick()
    assert worker.state is State.BACKOFF and worker.failed_starts == 1 and worker.delay == 0.5
    assert sup.start_given_up() == []


def test_it_counts_failed_starts_only_in_a_row(made, clock, tmp_path):
    flag = tmp_path / "broken"
    flag.touch()
    argv = [sys.executable, "-c", f"import os, sys, time; os.path.exists({str(flag)!r}) and sys.exit(1); "
                                  "time.sleep(300)"]
    worker = Child("worker", 1, argv)
    sup = made(worker)
    sup.start_all()
    for attempt in range(5):  # one short of giving up
        ended(worker)
        sup.tick()
        assert worker.state is State.BACKOFF
        if attempt == 4:
            flag.unlink()  # what broke it is mended: the next start lasts
        clock.advance(worker.delay)
        sup.tick()
    assert worker.state is State.STARTING and worker.failed_starts == 5
    clock.advance(10)
    sup.tick()
    assert worker.state is State.RUNNING and worker.failed_starts == 0
    flag.touch()
    killed(worker)
    sup.tick()
    clock.advance(worker.delay)
    sup.tick()
    ended(worker)
    sup.tick()
    assert worker.state is State.BACKOFF and worker.failed_starts == 1


@pytest.mark.parametrize(("argv", "level", "words"), [
    ([sys.executable, "-c", "pass"], logging.WARNING, "code 0"),
    (EXIT_3, logging.ERROR, "code 3"),
    ([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"], logging.ERROR,
     "SIGKILL (possibly out of memory)"),
    ([sys.executable, "-c", "import os, resource, signal; resource.setrlimit(resource.RLIMIT_CORE, (0, 0)); "
                            "os.kill(os.getpid(), signal.SIGSEGV)"], logging.ERROR, "SIGSEGV"),
    ([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"], logging.WARNING, "SIGTERM"),
])
def test_it_logs_each_exit_at_the_level_of_its_cause(made, clock, caplog, argv, level, words):
    worker = Child("worker", 1, argv)
    sup = made(worker)
    sup.start_all()
    ended(worker)
    sup.tick()
    [record] = [r for r in caplog.records if " exited with " in r.getMessage()]
    assert record.levelno == level and f") exited with {words} after " in record.getMessage()
    assert status_of(sup, "worker 1")["last_exit"]["cause"] == words


def test_it_counts_a_child_it_cannot_even_start_as_a_failed_start(made, clock, caplog, tmp_path):
    worker = Child("worker", 1, [str(tmp_path / "no-such-program")])
    sup = made(worker, policy=RestartPolicy(give_up_after=2))
    sup.start_all()
    assert worker.state is State.BACKOFF and worker.proc is None and worker.failed_starts == 1
    assert messages(caplog, logging.ERROR)[0] == ("worker 1 could not start: No such file or directory; "
                                                  "restarting in 0.5 s (restart #1)")
    clock.advance(worker.delay)
    sup.tick()
    assert worker.state is State.FATAL
    assert status_of(sup, "worker 1")["last_exit"] == {"pid": None, "code": None, "signal": None,
                                                       "cause": "could not start: No such file or directory"}


def test_it_refuses_a_transition_the_table_does_not_list(made):
    worker = Child("worker", 1, SLEEPER)
    sup = made(worker)
    with pytest.raises(TransitionError, match="stopped -> running"):
        sup._become(worker, State.RUNNING)


def test_it_stops_the_web_tier_first_then_the_workers_and_sigkills_what_outlives_the_bound(made, clock, caplog,
                                                                                           tmp_path):
    ready, grandchild_file = tmp_path / "ready", tmp_path / "grandchild"
    stubborn = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                                      f"open({str(ready)!r}, 'w').close(); time.sleep(300)"]
    leaves_a_grandchild = [sys.executable, "-c", "import subprocess, time; p = subprocess.Popen(['sleep', '300']); "
                                                 f"open({str(grandchild_file)!r}, 'w').write(str(p.pid)); time.sleep(300)"]
    web, worker1, worker2 = Child("web", 0, leaves_a_grandchild), Child("worker", 1, stubborn), Child("worker", 2,
                                                                                                      EXIT_3)
    sup = made(web, worker1, worker2)
    sup.start_all()
    ended(worker2)
    sup.tick()
    assert worker2.state is State.BACKOFF
    wait_until(lambda: ready.exists() and grandchild_file.exists() and grandchild_file.read_text(), 60,
               "the children ready (the stubborn worker's file, web's grandchild's pid)")
    grandchild = int(grandchild_file.read_text())
    began = clock.now()

    assert sup.shutdown() == 0

    assert [c.state for c in sup.children] == [State.STOPPED] * 3
    assert clock.now() - began >= STOP_SECS  # the stubborn worker was waited for, on the supervisor's clock
    said = [r.getMessage() for r in caplog.records]
    stops = [m for m in said if " stopped with " in m or " still running after " in m]
    assert [m.split(" (pid")[0] for m in stops] == ["web", "worker 1", "worker 1"], stops
    assert stops[0].endswith("stopped with SIGTERM") and stops[2].endswith("stopped with SIGKILL")
    assert worker1.proc.returncode == -signal.SIGKILL and web.proc.returncode == -signal.SIGTERM
    # what web left in its process group went with it
    wait_until(lambda: pid_gone(grandchild), 5, f"web's grandchild (pid {grandchild}) gone")
    assert not sup.status_file.exists()


def test_it_stops_everything_and_exits_1_when_the_web_tier_gives_up(made, clock, caplog):
    """In `run`, with its signal handlers (put back afterwards)."""
    web, worker = Child("web", 0, EXIT_3), Child("worker", 1, SLEEPER)
    sup = made(web, worker)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    try:
        assert sup.run() == 1
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    assert web.state is State.STOPPED and web.failed_starts == 6 and worker.state is State.STOPPED
    assert worker.proc.returncode == -signal.SIGTERM
    [critical] = messages(caplog, logging.CRITICAL)
    assert "web (pid " in critical and "nothing can serve the dashboard or the API" in critical
    assert any(m.startswith("web given up: stopping (web first") for m in messages(caplog, logging.INFO))
    assert not sup.status_file.exists()


def test_the_system_clock_shows_a_monotonic_moment_as_unix_time():
    clock = Clock()
    before = time.time()
    shown = clock.wall(clock.now())
    assert before - 1 <= shown <= time.time() + 1
    assert clock.wall(clock.now() - 60) < shown
