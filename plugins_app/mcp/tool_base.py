"""The shape of an MCP tool (plugins_app/mcp/tools.py lists them) and of its refusals."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from engine import hook_requests
from engine.errors import ServiceError, validation_details
from plugins_app.models import ApiToken

Run = Callable[[dict[str, Any], ApiToken], Awaitable[dict[str, Any]]]


class McpToolError(Exception):
    """A refused or failed call: answered as a tool result with isError (the protocol's tool error)."""

    def __init__(self, code: str, message: str, details: Any = None):
        super().__init__(message)
        self.body = {"error": {"code": code, "message": message, "details": details}}

    @classmethod
    def of(cls, exc: ServiceError) -> McpToolError:
        return cls(exc.code, exc.message, exc.details)

    @classmethod
    def invalid(cls, tool: str, exc: hook_requests.ValidationError) -> McpToolError:
        return cls("validation_error", f"invalid {tool} arguments", validation_details(exc.errors()))


@dataclass
class ToolDef:
    name: str
    description: str
    input_schema: dict[str, Any]
    allowed: Callable[[str], bool]
    run: Run
    output_schema: dict[str, Any] | None = None


def schema_of(model: type[BaseModel]) -> dict[str, Any]:
    """A model's JSON schema as a tool's schema: its own `$defs`, so every `$ref` resolves within it."""
    schema = model.model_json_schema()
    schema.setdefault("type", "object")
    return schema


def checked(model: type[BaseModel], tool: str, args: dict[str, Any]) -> BaseModel:
    try:
        return model.model_validate(args)
    except hook_requests.ValidationError as exc:
        raise McpToolError.invalid(tool, exc) from exc
