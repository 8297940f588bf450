"""The plugins' data disks (engine/process/data_disks.py) as a worker finds them when it starts: each installed
plugin's image mounted again on its data directory (after a reboot, or a `librefang start` that released them when
it stopped), so that what a plugin kept is where the service and its dashboard look before its first hook runs."""

from __future__ import annotations

import logging

from engine.process import data_disks
from plugins_app.home import config_cache, home

log = logging.getLogger("librefang.worker")


def mount_installed() -> list[str]:
    """Mount the data disk of every installed plugin that has one; the plugins whose disk is not capped (each
    hook's trace says why, as `data_disk`)."""
    h = home()
    size_mb = config_cache().get().limits.max_disk_mb
    uncapped = []
    for name in data_disks.images_of(h.root / "plugin_data"):
        if not (h.plugin_dir(name) / "plugin.toml").is_file():
            continue  # an image of a plugin that is not installed here stays as it is
        data_dir = h.data_dir(name)
        data_dir.mkdir(parents=True, exist_ok=True)
        data_disks.ensure(data_dir, size_mb)
        note = data_disks.note(data_dir)
        if note:
            log.warning("plugin %s: data directory %s", name, note)
            if note.startswith("not size-capped"):
                uncapped.append(name)
    return uncapped
