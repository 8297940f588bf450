"""Wiring the pure-Python engine to Django in the worker: database memory, recorded invocations, live stderr. The
catalog and config caches it runs on are the process's (plugins_app/home.py), the same ones selectors read. The web
tier never builds the engine: it uses plugins_app/services/hook_policy.py."""

from __future__ import annotations

import functools
import logging

from engine.stack import ContextEngine, EngineDeps
from plugins_app import events
from plugins_app.home import catalog, config_cache, forget, home
from plugins_app.selectors.permissions import DbApprovals
from plugins_app.services.hook_policy import hook_policy
from plugins_app.services.memory import DbMemoryStore
from plugins_app.services.recording import DbInvocationSink
from plugins_app.services.summarizer import summarizer_for

log = logging.getLogger("librefang.engine")


@functools.lru_cache(maxsize=1)
def invocation_sink() -> DbInvocationSink:
    return DbInvocationSink()


@functools.lru_cache(maxsize=1)
def get_engine() -> ContextEngine:
    """One engine per process: its catalog and config caches re-read files only when they change."""
    deps = EngineDeps(home=home(), memory=DbMemoryStore(), invocations=invocation_sink(),
                      stderr=events.publisher(), summarizer_for=summarizer_for, approvals=DbApprovals())
    return ContextEngine(deps, catalog=catalog(), config=config_cache())


def reset_engine() -> None:
    """Forget cached engine state (tests that switch LIBREFANG_HOME)."""
    for cached in (get_engine, hook_policy):
        cached.cache_clear()
    forget()


class _FixedConfig:
    """The context-engine configuration a job carried, in place of the host's config.toml."""

    def __init__(self, cfg):
        self._cfg = cfg

    def get(self):
        return self._cfg


@functools.lru_cache(maxsize=32)
def _parsed_config(text: str):
    from engine.config import ServiceConfig, parse_service_config

    return parse_service_config(text) if text.strip() else ServiceConfig()


def engine_for_job(bundles: dict[str, str] | None, config_text: str = "") -> ContextEngine:
    """The engine as a job that names bundles must see it: those plugin versions and that configuration, sharing
    the process engine's caches and pools. Without bundles: the process engine, unchanged."""
    import copy

    from engine.plugins.catalog import PinnedCatalog
    from plugins_app.services.bundles import materialise

    base = get_engine()
    if bundles is None:
        return base
    view = copy.copy(base)
    view.catalog = PinnedCatalog(base.catalog, materialise(bundles))
    view.config = _FixedConfig(_parsed_config(config_text))
    return view
