"""What a plugin keeps in its data directory, `$LIBREFANG_HOME/plugin_data/<name>` (`GET /api/plugins/<name>/state`,
the plugin page's State panel and `librefang plugin state`)."""

from __future__ import annotations

import datetime as dt
import os

from engine.filecache import tree_size
from engine.plugins.catalog import LAST_GOOD_FILE
from engine.plugins.requirements import VENV_DIRS
from plugins_app.home import home

MAX_FILES_LISTED = 500
# Kept in the data dir by the service, not by the plugin: its virtualenv (install-deps) and the last manifest that
# loaded (engine/plugins/catalog.py). State routes neither list nor wipe them.
SERVICE_OWNED = frozenset(VENV_DIRS) | {LAST_GOOD_FILE}


def plugin_state(name: str) -> dict:
    """What the plugin keeps in $LIBREFANG_HOME/plugin_data/<name>: total size, file list (first 500 by path), and
    the agents that have a state file (enable_shared_state)."""
    root = home().data_dir(name)
    files, total, count = [], 0, 0
    if root.is_dir() and not root.is_symlink():
        for dirpath, dirnames, filenames in os.walk(root):
            top = dirpath == str(root)
            dirnames[:] = sorted(d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))
                                 and not (top and d in SERVICE_OWNED))
            for f in sorted(filenames):
                if top and f in SERVICE_OWNED:
                    continue
                full = os.path.join(dirpath, f)
                try:
                    st = os.lstat(full)
                except OSError:
                    continue
                count += 1
                total += st.st_size
                if len(files) < MAX_FILES_LISTED:
                    files.append({"path": os.path.relpath(full, root), "size_bytes": st.st_size,
                                  "modified": dt.datetime.fromtimestamp(st.st_mtime, dt.UTC).isoformat()})
    agents_dir = root / "agents"
    agents = sorted(p.name for p in agents_dir.iterdir() if (p / "state.json").is_file()) \
        if agents_dir.is_dir() and not agents_dir.is_symlink() else []
    venv = root / VENV_DIRS[0]
    return {"plugin": name, "path": str(root), "exists": root.is_dir(), "size_bytes": total, "file_count": count,
            "files": files, "files_truncated": count > len(files), "agents_with_state": agents,
            "venv": {"present": venv.is_dir(), "size_bytes": tree_size(str(venv)) if venv.is_dir() else 0}}
