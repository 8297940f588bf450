"""How Hermes finds the adapters: a plugin directory `$HERMES_HOME/plugins/librefang/` whose `register(ctx)` is
this module's. Hermes loads that directory twice, each time with its own `ctx`: its memory-provider discovery
(`memory.provider: librefang`) asks for the provider, its general plugin loader (`plugins.enabled: [librefang]`,
then `context.engine: librefang`) for the context engine. `install()` writes the directory."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from librefang_client.adapters.hermes import settings as config

PLUGIN = "librefang"
MANIFEST = """\
name: librefang
version: 0.1.0
description: "LibreFang context-engine service: memory (prefetch -> ingest, sync_turn -> after_turn, recall and \
remember tools) and context compression (compress -> compact)"
kind: standalone
"""
# "MemoryProvider" must appear in this file's text: Hermes's memory discovery looks for it before importing.
INIT = '''"""LibreFang for Hermes: the MemoryProvider and ContextEngine of librefang_client.adapters.hermes."""

from librefang_client.adapters.hermes import register  # noqa: F401
'''


def register(ctx: Any) -> None:
    """Hermes's plugin entry point: the memory discovery's context registers the provider, the general plugin
    loader's the context engine (each context has only its own method)."""
    if hasattr(ctx, "register_memory_provider"):
        from librefang_client.adapters.hermes.memory import LibreFangMemoryProvider

        ctx.register_memory_provider(LibreFangMemoryProvider())
    if hasattr(ctx, "register_context_engine"):
        from librefang_client.adapters.hermes.context import LibreFangContextEngine

        ctx.register_context_engine(LibreFangContextEngine())


def install(home: str | os.PathLike | None = None) -> Path:
    """Write the plugin directory into `$HERMES_HOME/plugins/` (replacing an earlier one) and return it."""
    target = config.hermes_home(home) / "plugins" / PLUGIN
    target.mkdir(parents=True, exist_ok=True)
    (target / "plugin.yaml").write_text(MANIFEST, encoding="utf-8")
    (target / "__init__.py").write_text(INIT, encoding="utf-8")
    return target
