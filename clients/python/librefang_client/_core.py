"""What the sync and async clients share: one call's description, the retry rule, and how an answer becomes a
model or an exception. Only the waiting and the sending differ between them (client.py)."""

from __future__ import annotations

import email.utils
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from pydantic import BaseModel

from librefang_client import errors

DEFAULT_URL = "http://127.0.0.1:4545"

# Failures where the request never reached the service: safe to send again whatever the call.
NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


@dataclass(frozen=True)
class Call:
    """One API call. `retry_safe`: sending it twice does no harm (GET, PUT by key, DELETE, the blocking hooks, and
    after_turn, which the service processes at least once anyway), so it is retried after a 503 or a connection
    lost mid-call; other calls only when the connection was never made."""

    method: str
    path: str
    reply: type[BaseModel] | None
    json: Any = None
    params: list[tuple[str, str]] = field(default_factory=list)
    retry_safe: bool = True


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter (`backoff` · 2^attempt, at most `max_backoff`); a 503's `Retry-After` is
    honoured instead (at most `max_retry_after`). No wait ever runs past the call's deadline."""

    max_retries: int = 8
    backoff: float = 0.2
    max_backoff: float = 5.0
    max_retry_after: float = 30.0

    def wait(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_retry_after)
        base = min(self.backoff * (2 ** attempt), self.max_backoff)
        return base / 2 + random.uniform(0, base / 2)


def settings(url: str | None, token: str | None) -> tuple[str, str]:
    """The service's URL and token: the arguments, else LIBREFANG_URL / LIBREFANG_TOKEN."""
    url = (url or os.environ.get("LIBREFANG_URL") or DEFAULT_URL).rstrip("/")
    token = token or os.environ.get("LIBREFANG_TOKEN")
    if not token:
        raise ValueError("no API token: pass token=... or set LIBREFANG_TOKEN "
                         "(`librefang token create --role agent --name <name>`)")
    return url, token


def retry_after(response: httpx.Response) -> float | None:
    """The `Retry-After` header in seconds (a number or an HTTP date), or None."""
    raw = response.headers.get("Retry-After")
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None  # unreadable: the backoff applies
    return max(when.timestamp() - time.time(), 0.0)


class Deadline:
    """The time left for one call, every attempt and wait included."""

    def __init__(self, seconds: float | None):
        self.end = None if seconds is None else time.monotonic() + seconds

    def left(self) -> float | None:
        return None if self.end is None else self.end - time.monotonic()

    def allows(self, wait: float) -> bool:
        left = self.left()
        return left is None or wait < left

    def attempt_timeout(self, timeout: float | None) -> float | None:
        left = self.left()
        if left is None:
            return timeout
        if left <= 0:
            raise errors.DeadlineExceeded(None, "deadline_exceeded", "the call's deadline passed")
        return left if timeout is None else min(timeout, left)


def outcome(call: Call, response: httpx.Response) -> Any:
    """The reply model of a successful answer; raises the error an unsuccessful one means."""
    try:
        body = response.json() if response.content else None
    except ValueError:
        body = response.text
    if response.is_success:
        return body if call.reply is None else call.reply.model_validate(body)
    raise errors.from_response(response.status_code, body, retry_after(response))


class Attempts:
    """The tries of one call: each attempt's timeout, and after a failure how long to wait before the next (or the
    error the caller gets). The sync and async clients drive it with their own sending and sleeping."""

    def __init__(self, call: Call, policy: RetryPolicy, deadline: Deadline):
        self.call, self.policy, self.deadline = call, policy, deadline
        self.count = 0

    def timeout(self, per_attempt: float | None) -> float | None:
        return self.deadline.attempt_timeout(per_attempt)

    def after(self, failure: Exception) -> float:
        """The wait before sending again; raises when the call should not be (or can no longer be) sent again."""
        wait = self._wait(failure)
        if wait is None:
            error = final_error(failure)
            if error is failure:
                raise failure
            raise error from failure
        self.count += 1
        return wait

    def _wait(self, failure: Exception) -> float | None:
        if self.count >= self.policy.max_retries:
            return None
        if isinstance(failure, errors.Unavailable):
            wait = self.policy.wait(self.count, failure.retry_after) if self.call.retry_safe else None
        elif isinstance(failure, NOT_SENT) or (self.call.retry_safe and isinstance(failure, httpx.TransportError)):
            wait = self.policy.wait(self.count, None)
        else:
            return None
        return wait if wait is not None and self.deadline.allows(wait) else None


def final_error(failure: Exception) -> Exception:
    """What the caller sees when retries end: the service's error, or one of ours for a transport failure."""
    if not isinstance(failure, httpx.TransportError):
        return failure
    if isinstance(failure, httpx.TimeoutException):
        return errors.DeadlineExceeded(None, "deadline_exceeded", f"no answer in time: {failure!r}")
    return errors.ConnectionFailed(None, "connection_error", f"the service could not be reached: {failure!r}")
