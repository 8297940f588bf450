"""Where the Hermes adapters find the service and whom they remember for: the arguments, else
`$HERMES_HOME/librefang.json` (what `hermes memory setup` writes: `url`, `agent_id`, `peer_id`, `recall_limit`,
`threshold_percent`), else LIBREFANG_URL / LIBREFANG_TOKEN / LIBREFANG_AGENT_ID / LIBREFANG_PEER_ID. The token is a
secret: only an argument or LIBREFANG_TOKEN (Hermes keeps secrets in `$HERMES_HOME/.env`), never the JSON file."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONFIG_FILE = "librefang.json"
FILE_KEYS = ("url", "agent_id", "peer_id", "recall_limit", "threshold_percent")


@dataclass(frozen=True)
class Settings:
    url: str | None = None
    token: str | None = None
    agent_id: str = "hermes"
    peer_id: str | None = None
    recall_limit: int = 5
    threshold_percent: float = 0.75


def hermes_home(given: str | os.PathLike | None = None) -> Path:
    if given:
        return Path(given)
    try:
        from hermes_constants import get_hermes_home  # Hermes's own answer (HERMES_HOME, profiles)
    except ImportError:  # Hermes not installed here: its documented default
        return Path(os.environ.get("HERMES_HOME") or Path.home() / ".hermes")
    return get_hermes_home()


def _from_file(home: Path) -> dict[str, Any]:
    path = home / CONFIG_FILE
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # a broken file is an error, never silently replaced by defaults
        raise ValueError(f"{path} is not a readable JSON object: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a JSON object")
    return {k: v for k, v in data.items() if k in FILE_KEYS and v not in (None, "")}


def _number(kind: type, name: str, value: Any) -> Any:
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise ValueError(f"librefang settings: {name} must be a number, not {value!r}") from None


def load(home: str | os.PathLike | None = None, **given: Any) -> Settings:
    """The settings for one provider or engine: `given` (arguments that are not None) win, then the file, then
    the environment."""
    env = {"url": os.environ.get("LIBREFANG_URL"), "token": os.environ.get("LIBREFANG_TOKEN"),
           "agent_id": os.environ.get("LIBREFANG_AGENT_ID"), "peer_id": os.environ.get("LIBREFANG_PEER_ID")}
    from_file = _from_file(hermes_home(home))
    merged = {k: v for k, v in env.items() if v}
    merged.update(from_file)
    merged.update({k: v for k, v in given.items() if v is not None})
    return Settings(url=merged.get("url"), token=merged.get("token"), agent_id=str(merged.get("agent_id") or "hermes"),
                    peer_id=merged.get("peer_id") or None,
                    recall_limit=_number(int, "recall_limit", merged.get("recall_limit", 5)),
                    threshold_percent=_number(float, "threshold_percent", merged.get("threshold_percent", 0.75)))


def save(values: dict[str, Any], home: str | os.PathLike) -> Path:
    """`hermes memory setup`'s non-secret answers, merged into `$HERMES_HOME/librefang.json` (0600)."""
    path = Path(home) / CONFIG_FILE
    current = _from_file(Path(home))
    current.update({k: v for k, v in values.items() if k in FILE_KEYS})
    path.write_text(json.dumps(current, indent=2) + "\n", encoding="utf-8")
    path.chmod(0o600)
    return path
