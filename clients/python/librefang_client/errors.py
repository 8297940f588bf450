"""Errors as exceptions: every refusal the service sends is `{"error": {"code", "message", "details"}}`, and the
exception carries those three and the HTTP status."""

from __future__ import annotations

from typing import Any


class LibreFangError(Exception):
    """A call that did not succeed. `code` is the service's stable error code (e.g. `validation_error`,
    `agent_forbidden`, `not_found`, `conflict`, `bus_unavailable`), or one of this client's own:
    `connection_error` (no answer) and `deadline_exceeded` (the call's deadline passed while retrying)."""

    def __init__(self, status: int | None, code: str, message: str, details: Any = None,
                 retry_after: float | None = None):
        super().__init__(f"{code}: {message}" if status is None else f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details = details
        self.retry_after = retry_after


class BadRequest(LibreFangError):
    """400: the request does not fit the contract (`details` says where: `[{loc, msg, type}]`)."""


class Unauthorized(LibreFangError):
    """401: no token, or one the service does not know."""


class Forbidden(LibreFangError):
    """403: the token's role may not do this, or it is bound to other agents (`agent_forbidden`)."""


class NotFound(LibreFangError):
    """404."""


class Conflict(LibreFangError):
    """409: e.g. a memory `key` already used in its scope (put replaces)."""


class Unavailable(LibreFangError):
    """503 after every retry: e.g. after_turn not stored while the service's job bus is down."""


class ConnectionFailed(LibreFangError):
    """The service could not be reached (after every retry)."""


class DeadlineExceeded(LibreFangError):
    """The call's deadline passed before an answer."""


BY_STATUS: dict[int, type[LibreFangError]] = {400: BadRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound,
                                              409: Conflict, 503: Unavailable}


def from_response(status: int, body: Any, retry_after: float | None = None) -> LibreFangError:
    """The exception for an error answer; a body that is not the envelope (a proxy's page) keeps its text."""
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and isinstance(error.get("code"), str):
        code, message, details = error["code"], str(error.get("message", "")), error.get("details")
    else:
        code, message, details = "http_error", f"HTTP {status}", body
    cls = BY_STATUS.get(status, LibreFangError)
    return cls(status, code, message, details, retry_after)
