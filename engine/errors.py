"""The one shape of a refused operation, shared by the engine (InstallError, ToolError) and the web tier (PluginError,
ApiError): a stable `code`, a readable `message`, the HTTP `status` to answer with, and optional JSON-able
`details`. The API renders every ServiceError in its error envelope (plugins_app/api/errors.py)."""

from __future__ import annotations

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
