"""Schemas of the permission routes (plugins_app/api/permissions.py)."""

from __future__ import annotations

from typing import Any

from ninja import Schema
from pydantic import ConfigDict, Field

from plugins_app.schemas import Open


class ApproveIn(Schema):
    """Approve the plugin.toml on disk; with `manifest_sha256`, only if it is still that version."""

    model_config = ConfigDict(extra="forbid")
    manifest_sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")


class PermissionsOut(Open):
    plugin: str
    manifest_sha256: str
    valid: bool
    asks: list[dict[str, Any]]
    asks_nothing: bool
    approved: bool
    needs_approval: bool
    last_approved: dict[str, Any] | None
    changes: dict[str, list[dict[str, Any]]]
    manifest_diff: str
    ceilings: dict[str, Any]
    effective: dict[str, Any] | None
