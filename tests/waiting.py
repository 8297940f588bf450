"""The one way a test waits for something to happen: it probes until what it sees holds, and fails saying what it
waited for and what it saw last. A test never sleeps for an event it can observe; it sleeps only where time passing
is itself the point, and says so."""

from __future__ import annotations

import asyncio
import inspect
import os
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

FIRST_PAUSE_SECS = 0.01  # probed again quickly at first, then less and less often, up to MAX_PAUSE_SECS apart
MAX_PAUSE_SECS = 0.2
SHOWN_CHARS = 2000  # of the last value seen, in the failure


class WaitTimedOut(AssertionError):
    """What was awaited did not happen in time: a failure of the test, not an error in it."""


def wait_until(probe: Callable[[], T], timeout: float, what: str, *, until: Callable[[T], object] = bool,
               ignoring: tuple[type[BaseException], ...] = (), every: float | None = None) -> T:
    """Call `probe` until `until(value)` holds (by default: until the value is truthy) and return that value.

    After `timeout` seconds, fail with WaitTimedOut naming `what` and the last value seen. An exception of a type in
    `ignoring` (from `probe` or `until`) counts as "not yet" and is shown as the last value; any other propagates at
    once. `every` probes at a fixed interval instead, for a moment that lasts milliseconds."""
    end = time.monotonic() + timeout
    pauses = _pauses(every)
    while True:
        try:
            seen: object = probe()
            if until(seen):
                return seen
        except ignoring as exc:
            seen = exc
        left = end - time.monotonic()
        if left <= 0:
            raise WaitTimedOut(_failure(what, timeout, seen))
        time.sleep(min(next(pauses), left))


async def wait_until_async(probe: Callable[[], T | Awaitable[T]], timeout: float, what: str, *,
                           until: Callable[[T], object] = bool,
                           ignoring: tuple[type[BaseException], ...] = (), every: float | None = None) -> T:
    """wait_until for a coroutine: `probe` may return an awaitable, and the loop keeps running between probes."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    pauses = _pauses(every)
    while True:
        try:
            seen: object = probe()
            if inspect.isawaitable(seen):
                seen = await seen
            if until(seen):
                return seen
        except ignoring as exc:
            seen = exc
        left = end - loop.time()
        if left <= 0:
            raise WaitTimedOut(_failure(what, timeout, seen))
        await asyncio.sleep(min(next(pauses), left))


def pid_gone(pid: int) -> bool:
    """No process has this pid any more (a zombie still has it: it is gone once reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _pauses(every: float | None):
    pause = every or FIRST_PAUSE_SECS
    while True:
        yield pause
        if every is None:
            pause = min(pause * 2, MAX_PAUSE_SECS)


def _failure(what: str, timeout: float, seen: object) -> str:
    shown = repr(seen)
    if len(shown) > SHOWN_CHARS:
        shown = shown[:SHOWN_CHARS] + f"... ({len(shown)} characters)"
    return f"gave up after {timeout:g} s waiting for {what}; last seen: {shown}"
