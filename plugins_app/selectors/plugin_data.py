"""What a plugin keeps in its data directory, `$LIBREFANG_HOME/plugin_data/<name>` (`GET /api/plugins/<name>/state`,
the plugin page's State panel and `librefang plugin state`)."""

from __future__ import annotations

from engine.filecache import tree_size
from engine.plugins.catalog import LAST_GOOD_FILE
from engine.plugins.requirements import VENV_DIRS
from engine.process import data_disks, plugin_files
from plugins_app.home import home

MAX_FILES_LISTED = 500
# Kept in the data dir by the service, not by the plugin: its virtualenv (install-deps) and the last manifest that
# loaded (engine/plugins/catalog.py). State routes neither list nor wipe them.
SERVICE_OWNED = frozenset(VENV_DIRS) | {LAST_GOOD_FILE}


def plugin_state(name: str) -> dict:
    """What the plugin keeps in $LIBREFANG_HOME/plugin_data/<name>: total size, file list (first 500 by path), and
    the agents that have a state file (enable_shared_state). Read through engine/process/plugin_files.py: what the
    hooks wrote is their identity's (a service that is not root reads it as root of its user namespace)."""
    root = home().data_dir(name)
    try:
        seen = plugin_files.listing(root, SERVICE_OWNED, MAX_FILES_LISTED)
    except OSError:
        seen = {"files": [], "file_count": 0, "size_bytes": 0, "agents_with_state": []}
    venv = root / VENV_DIRS[0]
    return {"plugin": name, "path": str(root), "exists": root.is_dir(), "size_bytes": seen["size_bytes"],
            "file_count": seen["file_count"], "files": seen["files"],
            "files_truncated": seen["file_count"] > len(seen["files"]), "agents_with_state": seen["agents_with_state"],
            "venv": {"present": venv.is_dir(), "size_bytes": tree_size(str(venv)) if venv.is_dir() else 0},
            # its own filesystem (engine/process/data_disks.py): None until its first hook, or where it cannot be
            "disk": data_disks.usage(root), "disk_unavailable": data_disks.unavailable()}
