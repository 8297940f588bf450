"""Where things live under $LIBREFANG_HOME."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Home:
    root: Path

    @classmethod
    def from_env(cls) -> Home:
        return cls(Path(os.environ.get("LIBREFANG_HOME", Path.home() / ".librefang")).expanduser())

    @property
    def plugins_dir(self) -> Path:
        return self.root / "plugins"

    @property
    def config_path(self) -> Path:
        return self.root / "config.toml"

    @property
    def lockfile(self) -> Path:
        return self.root / "plugins.lock"

    @property
    def tools_dir(self) -> Path:
        return self.root / "tools"

    def plugin_dir(self, name: str) -> Path:
        return self.plugins_dir / name

    def data_dir(self, name: str) -> Path:
        """Writable per-plugin directory handed to hooks as LIBREFANG_PLUGIN_DATA_DIR."""
        return self.root / "plugin_data" / name
