"""A problem found in a plugin: stable id, severity, message and a hint. Used by lint, doctor and the API."""

from __future__ import annotations

from dataclasses import asdict, dataclass

ERROR = "error"
WARNING = "warning"


@dataclass(frozen=True)
class Finding:
    id: str
    severity: str
    message: str
    hint: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def error(id: str, message: str, hint: str = "") -> Finding:
    return Finding(id, ERROR, message, hint)


def warning(id: str, message: str, hint: str = "") -> Finding:
    return Finding(id, WARNING, message, hint)


def has_errors(findings: list[Finding]) -> bool:
    return any(f.severity == ERROR for f in findings)
