"""Hermes Agent (Nous Research) on this service: `LibreFangMemoryProvider` (its `MemoryProvider`: prefetch ->
ingest, sync_turn -> after_turn, tools to recall and remember) and `LibreFangContextEngine` (its `ContextEngine`:
should_compress/compress -> compact).

    python -m librefang_client.adapters.hermes install     # writes $HERMES_HOME/plugins/librefang/

then, in `$HERMES_HOME/config.yaml`:

    memory:
      provider: librefang
    plugins:
      enabled: [librefang]
    context:
      engine: librefang

with LIBREFANG_URL and LIBREFANG_TOKEN in the environment (or `$HERMES_HOME/.env`). docs/agents.md says more.
"""

from librefang_client.adapters.hermes.plugin import install, register

__all__ = ["LibreFangContextEngine", "LibreFangMemoryProvider", "install", "register"]


def __getattr__(name: str):
    # The classes import Hermes's own modules: only when asked for, so that installing the plugin needs no Hermes.
    if name == "LibreFangMemoryProvider":
        from librefang_client.adapters.hermes.memory import LibreFangMemoryProvider

        return LibreFangMemoryProvider
    if name == "LibreFangContextEngine":
        from librefang_client.adapters.hermes.context import LibreFangContextEngine

        return LibreFangContextEngine
    raise AttributeError(name)
