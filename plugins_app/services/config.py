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


def _rewrite(path: Path, change) -> str:
    """Load config.toml, let `change` edit the document, write it back atomically; the new text. One writer at a
    time in this process."""
    with _lock:
        doc = _load(path)
        change(doc)
        text = tomlkit.dumps(doc)
        atomic_write(path, text)
        return text


def write_chain(path: Path, plugin: str | None, plugin_stack: list[str] | None) -> str:
    """Set the active plugin or stack (None/[] for both: the default engine). Returns the new file text."""

    def change(doc):
        ce = _table(doc, "context_engine")
        if plugin_stack:
            ce["plugin_stack"] = _array(plugin_stack)
            ce.pop("plugin", None)
        else:
            ce.pop("plugin_stack", None)
            if plugin:
                ce["plugin"] = plugin
            else:
                ce.pop("plugin", None)

    return _rewrite(path, change)


def write_alerts(path: Path, rules: list[str], fallback_rate: float, queue_lag: int, webhooks: list[dict]) -> str:
    """Set `[alerts]`'s rules, thresholds and webhooks (plugins_app/selectors/alerts.py reads them); keys this does
    not set (every_secs) and the rest of the file are kept. Returns the new file text."""

    def change(doc):
        alerts = _table(doc, "alerts")
        alerts["rules"] = _array(rules)
        alerts["fallback_rate"] = fallback_rate
        alerts["queue_lag"] = queue_lag
        alerts.pop("webhooks", None)
        if webhooks:
            hooks = tomlkit.aot()
            for hook in webhooks:
                entry = tomlkit.table()
                entry["url"] = hook["url"]
                entry["format"] = hook["format"]
                hooks.append(entry)
            alerts["webhooks"] = hooks

    return _rewrite(path, change)


def _array(values: list[str]):
    array = tomlkit.array()
    array.extend(values)
    return array
