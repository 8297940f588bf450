"""The wire rules every hook shares: how stdout becomes a reply, and how failures are classified."""

from __future__ import annotations

import json
import signal
from dataclasses import asdict, dataclass
from typing import Any

STREAM_CAP_BYTES = 1024 * 1024  # per stream; the child is killed on overflow (LibreFang #3534)
MESSAGE_ENV_CAP_BYTES = 64 * 1024  # LIBREFANG_MESSAGE; Linux refuses a single env string over 128 KiB


class EmptyOutput(Exception):
    """The hook exited 0 but printed nothing usable."""


# Deepest JSON nesting a reply may have: serde_json's default recursion limit, which LibreFang parses with.
# A deeper line is "not JSON" (it falls through to the {"text": …} fallback) instead of a RecursionError here
# or later, when the reply is validated, stored or sent on.
MAX_JSON_DEPTH = 128


def parse_output(stdout: str) -> Any:
    """Scan stdout bottom-up; the first line that parses as JSON (any type) nested at most MAX_JSON_DEPTH deep wins.

    No JSON line and blank stdout raises EmptyOutput; otherwise the whole stdout becomes {"text": …}.
    """
    lines = stdout.splitlines()
    for line in reversed(lines):
        stripped = line.strip()
        if not stripped:
            continue
        try:
            value = json.loads(stripped)
        except (ValueError, RecursionError):
            continue
        if stripped.count("[") + stripped.count("{") > MAX_JSON_DEPTH and json_depth(value) > MAX_JSON_DEPTH:
            continue
        return value
    if not stdout.strip():
        raise EmptyOutput("hook printed nothing on stdout")
    return {"text": "\n".join(line.rstrip() for line in lines)}


def json_depth(value: Any) -> int:
    """Nesting depth of a parsed JSON value (a scalar is 0, `[]` is 1), walked without recursion."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


# Failure kinds. Stable strings: they appear in the API, traces, metrics and the dashboard.
SCRIPT_NOT_FOUND = "script_not_found"
PATH_TRAVERSAL = "path_traversal"
LAUNCHER_NOT_FOUND = "launcher_not_found"
SPAWN_FAILED = "spawn_failed"
IO_ERROR = "io_error"
TIMEOUT = "timeout"
SCRIPT_ERROR = "script_error"
EMPTY_OUTPUT = "empty_output"
INVALID_OUTPUT = "invalid_output"
INVALID_INPUT = "invalid_input"
OUTPUT_OVERFLOW = "output_overflow"
MANIFEST_INVALID = "manifest_invalid"
INTEGRITY_FAILED = "integrity_failed"
HOOK_NOT_DECLARED = "hook_not_declared"
PLUGIN_DISABLED = "plugin_disabled"
PLUGIN_NOT_FOUND = "plugin_not_found"
DEADLINE_EXCEEDED = "deadline_exceeded"
WORKER_UNAVAILABLE = "worker_unavailable"
ABORTED = "aborted"
CIRCUIT_OPEN = "circuit_open"


@dataclass
class Failure:
    kind: str
    message: str
    exit_code: int | None = None
    signal: int | None = None

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


def classify_exit(returncode: int) -> tuple[str, int | None, int | None]:
    """A readable label for a non-zero exit, plus (exit_code, signal)."""
    if returncode < 0:
        sig = -returncode
        if sig == signal.SIGKILL:
            return "OOM-killed or SIGKILL (signal 9)", None, sig
        if sig == signal.SIGSEGV:
            return "SIGSEGV (signal 11)", None, sig
        if sig == signal.SIGSYS:
            return "SIGSYS (signal 31): blocked system call", None, sig
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return f"killed by {name} (signal {sig})", None, sig
    if returncode == 137:
        return "OOM-killed or SIGKILL (exit 137)", returncode, None
    if returncode == 139:
        return "SIGSEGV (exit 139)", returncode, None
    return f"exit code {returncode}", returncode, None
