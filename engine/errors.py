"""The one shape of a refused operation, shared by the engine (InstallError, ToolError) and the web tier (PluginError,
ApiError): a stable `code`, a readable `message`, the HTTP `status` to answer with, and optional JSON-able
`details`. The API renders every ServiceError in its error envelope (plugins_app/api/errors.py)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


class ServiceError(Exception):
    def __init__(self, code: str, message: str, status: int = 400, details: Any = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        self.details = details

    def to_dict(self) -> dict:
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.details is not None:
            body["details"] = self.details
        return body


def validation_details(errors: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The `details` of a `validation_error`, REST's and MCP's alike: each problem's `loc` (as strings), `msg` and
    `type`, from pydantic's `ValidationError.errors()` (or django-ninja's, the same with the request part first)."""
    return [{"loc": [str(p) for p in e.get("loc", ())], "msg": e.get("msg"), "type": e.get("type")} for e in errors]
