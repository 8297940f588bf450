"""`[context_engine]` from $LIBREFANG_HOME/config.toml, re-read whenever the file changes on disk."""

from __future__ import annotations

import os
import threading
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class LlmConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")
    base_url: str | None = None
    model: str | None = None
    api_key_env: str | None = "LIBREFANG_LLM_API_KEY"
    timeout_secs: float = 30.0


class ContextEngineConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")

    plugin: str | None = None
    plugin_stack: list[str] = Field(default_factory=list)
    plugin_stack_weights: dict[str, float] = Field(default_factory=dict)
    stable_prefix_mode: bool = False
    max_recall_results: int = 5
    context_window_tokens: int = 200_000
    allowed_env_vars: list[str] = Field(default_factory=list)
    after_turn_max_chars: int | None = None

    @property
    def chain(self) -> list[str]:
        """Plugins in order. A stack wins over `plugin`; a one-entry stack is accepted too (LibreFang ignores it)."""
        if self.plugin_stack:
            return list(dict.fromkeys(self.plugin_stack))
        return [self.plugin] if self.plugin else []

    @property
    def mode(self) -> str:
        return "stacked" if len(self.chain) > 1 else "single" if self.chain else "default"


class ServiceConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")
    context_engine: ContextEngineConfig = Field(default_factory=ContextEngineConfig)
    llm: LlmConfig = Field(default_factory=LlmConfig)
    error: str | None = None


class ConfigCache:
    """Parses config.toml once per change (one stat per call). A broken file keeps the last good config."""

    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()
        self._stamp: tuple | None = None
        self._value = ServiceConfig()

    def get(self) -> ServiceConfig:
        try:
            st = os.stat(self.path)
            stamp: tuple = (st.st_mtime_ns, st.st_size, st.st_ino)
        except OSError:
            stamp = ()
        with self._lock:
            if stamp != self._stamp:
                self._value = self._load(stamp)
                self._stamp = stamp
            return self._value

    def _load(self, stamp: tuple) -> ServiceConfig:
        if not stamp:
            return ServiceConfig()
        try:
            raw: dict[str, Any] = tomllib.loads(self.path.read_text(encoding="utf-8"))
            return ServiceConfig.model_validate(raw)
        except (OSError, ValueError) as exc:
            previous = self._value.model_copy()
            previous.error = f"{self.path} is invalid, keeping the previous configuration: {exc}"
            return previous
