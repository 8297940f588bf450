"""What the web tier needs to answer a hook call without a worker: the deadline to wait for and the default
engine's answer (engine/hook_policy.py), over the process's cached catalog and config (plugins_app/home.py). It
imports no ContextEngine, so the web process never loads the hook runtimes (subprocess, zygote, wasmtime)."""

from __future__ import annotations

import functools

from engine.hook_policy import HookPolicy
from plugins_app.home import catalog, config_cache
from plugins_app.services.memory import DbMemoryStore
from plugins_app.services.summarizer import summarizer_for


@functools.lru_cache(maxsize=1)
def hook_policy() -> HookPolicy:
    """The process's deadline and fallback (the worker's engine decides the same way: engine/stack.py)."""
    return HookPolicy(catalog(), config_cache(), DbMemoryStore(), summarizer_for)
