"""tests/waiting.py: what the one wait helper returns, and how it fails."""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest

from tests.waiting import WaitTimedOut, pid_gone, wait_until, wait_until_async


def test_it_returns_the_first_value_that_holds():
    counter = itertools.count()
    assert wait_until(lambda: next(counter) >= 3 and "third", 30, "the third probe") == "third"
    assert wait_until(lambda: next(counter), 30, "an even count", until=lambda n: n % 2 == 0) % 2 == 0


def test_it_fails_naming_what_it_waited_for_and_the_last_value_seen():
    with pytest.raises(WaitTimedOut) as failed:
        wait_until(lambda: [], 0.05, "a non-empty list")
    assert "waiting for a non-empty list; last seen: []" in str(failed.value)
    assert isinstance(failed.value, AssertionError)  # reported as a test failure
    with pytest.raises(WaitTimedOut, match=r"last seen: 'x{1999}\.\.\. \(5002 characters\)"):
        wait_until(lambda: "x" * 5000, 0.01, "nothing", until=lambda _: False)


def test_it_counts_the_exceptions_it_ignores_as_not_yet_and_lets_others_through():
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionRefusedError("not listening yet")
        return "up"

    assert wait_until(flaky, 30, "the server", ignoring=(OSError,)) == "up"
    with pytest.raises(WaitTimedOut, match=r"last seen: ConnectionRefusedError\('never'\)"):
        wait_until(lambda: (_ for _ in ()).throw(ConnectionRefusedError("never")), 0.05, "the server",
                   ignoring=(OSError,))
    calls.clear()
    with pytest.raises(KeyError):
        wait_until(lambda: calls.append(1) or {}["missing"], 30, "a key", ignoring=(OSError,))
    assert len(calls) == 1  # not retried


async def test_its_async_twin_awaits_the_probe_and_fails_the_same_way():
    counter = itertools.count()

    async def probe() -> int:
        return next(counter)

    assert await wait_until_async(probe, 30, "the fourth probe", until=lambda n: n >= 3) == 3
    assert await wait_until_async(lambda: next(counter), 30, "a plain value") == 4
    with pytest.raises(WaitTimedOut, match="waiting for never; last seen: None"):
        await wait_until_async(lambda: None, 0.05, "never")


def test_a_pid_is_gone_once_its_process_is_reaped():
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    assert not pid_gone(child.pid)
    child.communicate(b"")
    assert pid_gone(child.pid)
