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


def _table(doc: tomlkit.TOMLDocument, name: str):
    """`[name]` of the document, added when missing; refused when the key is there but not a table."""
    table = doc.get(name)
    if table is None:
        table = tomlkit.table()
        doc[name] = table
    elif not isinstance(table, dict):
        raise ConfigWriteError(f"[{name}] in config.toml is not a table")
    return table


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
        ce = _table(doc, "context_engine")
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
        alerts = _table(doc, "alerts")
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
