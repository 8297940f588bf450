"""Wiring the pure-Python engine to Django: database memory, recorded invocations, live stderr. The catalog and
config caches it runs on are the process's (plugins_app/home.py), the same ones selectors read."""

from __future__ import annotations

import functools
import json
import logging
import urllib.request

from engine.config import LlmConfig
from engine.hook_policy import HookPolicy, deadline_secs
from engine.stack import CallCatalog, ContextEngine, EngineDeps
from plugins_app import events
from plugins_app.home import catalog, config_cache, forget, home
from plugins_app.services.memory import DbMemoryStore
from plugins_app.services.recording import DbInvocationSink

log = logging.getLogger("librefang.engine")


class OpenAICompatibleSummarizer:
    """POST {base_url}/chat/completions; used by the default compaction when [llm] is configured."""

    SYSTEM = ("You summarise earlier conversation turns for an AI agent. Keep facts, decisions, open tasks and "
              "names; drop chit-chat. Answer with the summary only.")

    def __init__(self, cfg: LlmConfig, api_key: str | None):
        self.cfg = cfg
        self.api_key = api_key

    def summarize(self, text: str, max_tokens: int, prompt: str | None = None) -> str:
        body = {
            "model": self.cfg.model,
            "temperature": 0.3,
            "max_tokens": max_tokens,
            "messages": [{"role": "system", "content": prompt or self.SYSTEM}, {"role": "user", "content": text}],
        }
        req = urllib.request.Request(
            self.cfg.base_url.rstrip("/") + "/chat/completions", data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json",
                     **({"Authorization": f"Bearer {self.api_key}"} if self.api_key else {})},
        )
        with urllib.request.urlopen(req, timeout=self.cfg.timeout_secs) as resp:  # noqa: S310 (operator's URL)
            data = json.loads(resp.read())
        return str(data["choices"][0]["message"]["content"] or "")


def summarizer_for(cfg: LlmConfig):
    import os

    if not (cfg.base_url and cfg.model):
        return None
    return OpenAICompatibleSummarizer(cfg, os.environ.get(cfg.api_key_env or "") or None)


@functools.lru_cache(maxsize=1)
def invocation_sink() -> DbInvocationSink:
    return DbInvocationSink()


@functools.lru_cache(maxsize=1)
def get_engine() -> ContextEngine:
    """One engine per process: its catalog and config caches re-read files only when they change."""
    deps = EngineDeps(home=home(), memory=DbMemoryStore(), invocations=invocation_sink(),
                      stderr=events.publisher(), summarizer_for=summarizer_for)
    return ContextEngine(deps, catalog=catalog(), config=config_cache())


class _WebHookPolicy(HookPolicy):
    def deadline_secs(self, hook: str) -> float:
        # each plugin looked up once per call (chain, then its timeouts): this runs on the web tier's event loop
        return deadline_secs(hook, CallCatalog(self.catalog), self.config.get())


@functools.lru_cache(maxsize=1)
def hook_policy() -> HookPolicy:
    """What the web tier's hook path needs (a deadline, the default engine's answer): no ContextEngine is built."""
    return _WebHookPolicy(catalog(), config_cache(), DbMemoryStore(), summarizer_for)


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
