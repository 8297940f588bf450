"""What the plugin CLI's actions share: the command they write through, the audit actor, an installed plugin."""

from __future__ import annotations

import getpass
import json
import sys
from pathlib import Path
from typing import Any, Protocol

from django.core.management.base import CommandError, OutputWrapper

from plugins_app.selectors import plugins as plugin_selectors
from plugins_app.selectors.plugins import PluginSummary


class Cli(Protocol):
    """The `plugin` management command as an action sees it."""

    as_json: bool
    stdout: OutputWrapper
    stderr: OutputWrapper

    def out(self, data: Any, text: str | None = None) -> None: ...


def actor() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except Exception:
        return "cli"


def installed(name: str) -> PluginSummary:
    summary = plugin_selectors.get_plugin(name)
    if summary is None:
        raise CommandError(f"plugin {name!r} is not installed", returncode=3)
    return summary


def read_input(raw: str) -> dict:
    """--input: JSON text, @file, or - for stdin."""
    try:
        text = sys.stdin.read() if raw == "-" else Path(raw[1:]).read_text() if raw.startswith("@") else raw
        data = json.loads(text)
    except (OSError, ValueError) as exc:
        raise CommandError(f"--input is not valid JSON: {exc}", returncode=2) from exc
    if not isinstance(data, dict):
        raise CommandError("--input must be a JSON object", returncode=2)
    return data
