"""Writing `[context_engine]` and `[alerts]` in $LIBREFANG_HOME/config.toml: tomlkit keeps the operator's comments and layout,
and the file is replaced atomically (write a temp file, fsync, rename)."""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path

import tomlkit
from tomlkit.exceptions import TOMLKitError

_lock = threading.Lock()


class ConfigWriteError(Exception):
    pass


def _load(path: Path) -> tomlkit.TOMLDocument:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return tomlkit.document()
    try:
        return tomlkit.parse(text)
    except TOMLKitError as exc:
        raise ConfigWriteError(f"{path} is not valid TOML ({exc}); fix it by hand before changing it here") from exc


def atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".config-", suffix=".toml", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        if path.exists():
            os.chmod(tmp, path.stat().st_mode & 0o777)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_chain(path: Path, plugin: str | None, plugin_stack: list[str] | None) -> str:
    """Set the active plugin or stack (None/[] for both: the default engine). Returns the new file text."""
    with _lock:
        doc = _load(path)
        ce = doc.get("context_engine")
        if ce is None:
            ce = tomlkit.table()
            doc["context_engine"] = ce
        elif not isinstance(ce, dict):
            raise ConfigWriteError("[context_engine] in config.toml is not a table")
        if plugin_stack:
            arr = tomlkit.array()
            arr.extend(plugin_stack)
            ce["plugin_stack"] = arr
            if "plugin" in ce:
                del ce["plugin"]
        else:
            if "plugin_stack" in ce:
                del ce["plugin_stack"]
            if plugin:
                ce["plugin"] = plugin
            elif "plugin" in ce:
                del ce["plugin"]
        text = tomlkit.dumps(doc)
        atomic_write(path, text)
        return text


def write_alerts(path: Path, rules: list[str], fallback_rate: float, queue_lag: int, webhooks: list[dict]) -> str:
    """Set `[alerts]`'s rules, thresholds and webhooks (plugins_app/selectors/alerts.py reads them); keys this does
    not set (every_secs) and the rest of the file are kept. Returns the new file text."""
    with _lock:
        doc = _load(path)
        alerts = doc.get("alerts")
        if alerts is None:
            alerts = tomlkit.table()
            doc["alerts"] = alerts
        elif not isinstance(alerts, dict):
            raise ConfigWriteError("[alerts] in config.toml is not a table")
        rule_list = tomlkit.array()
        rule_list.extend(rules)
        alerts["rules"] = rule_list
        alerts["fallback_rate"] = fallback_rate
        alerts["queue_lag"] = queue_lag
        hooks = tomlkit.aot()
        for hook in webhooks:
            entry = tomlkit.table()
            entry["url"] = hook["url"]
            entry["format"] = hook["format"]
            hooks.append(entry)
        if webhooks:
            alerts["webhooks"] = hooks
        elif "webhooks" in alerts:
            del alerts["webhooks"]
        text = tomlkit.dumps(doc)
        atomic_write(path, text)
        return text
