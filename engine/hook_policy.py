"""What the web tier needs around an agent's hook call, without building a ContextEngine (engine/stack.py): how long
to wait for a worker, and the default engine's answer (engine/default_engine.py) when no worker answers in time.

The rules are the engine's own: tests/app/test_api_hook_lean.py checks both against ContextEngine.deadline_secs and
ContextEngine.default for every hook.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine import default_engine as D
from engine import hooks as H
from engine.config import ConfigCache, LlmConfig, ServiceConfig
from engine.hook_requests import normalise
from engine.hooks import retry_delay_ms
from engine.plugins.catalog import CallCatalog, Catalog
from engine.ports import MemoryStore, Summarizer
from engine.strategies import STRATEGIES


def chain(catalog: Catalog, cfg: ServiceConfig) -> list[str]:
    """Configured plugins that are installed and enabled, in order."""
    return [name for name in cfg.context_engine.chain if catalog.exists(name) and catalog.get(name).enabled]


def skipped_layers(catalog: Catalog, cfg: ServiceConfig) -> list[str]:
    """Why configured plugins are not in the chain: `plugin_disabled: x is disabled`, `plugin_not_installed: …`."""
    out = []
    for name in cfg.context_engine.chain:
        if not catalog.exists(name):
            out.append(f"plugin_not_installed: {name} is not installed")
        elif not catalog.get(name).enabled:
            out.append(f"plugin_disabled: {name} is disabled")
    return out


def deadline_secs(hook: str, catalog: Catalog, cfg: ServiceConfig) -> float:
    """How long an agent may wait for `hook`: every layer's timeout (H.timeout_for) with its retries; layers that
    run in order add up, concurrent ones (engine/strategies.py: ingest, after_turn) take the slowest. The default
    timeout when no plugin serves."""
    budgets = []
    for name in chain(catalog, cfg):
        plugin = catalog.get(name).plugin
        if plugin is None or not plugin.manifest.hooks.script_for(hook):
            continue
        s = plugin.manifest.hooks
        delays = sum(retry_delay_ms(s.retry_delay_ms, n) for n in range(1, s.max_retries + 1)) / 1000
        budgets.append(H.timeout_for(hook, s) * (1 + s.max_retries) + delays)
    if not budgets:
        return H.timeout_for(hook)
    return max(budgets) if STRATEGIES[hook].concurrent else sum(budgets)


def default_result(hook: str, req: dict[str, Any], cfg: ServiceConfig, memory: MemoryStore,
                   summarizer: Summarizer | None) -> dict[str, Any]:
    """The built-in engine's result for a normalised request."""
    if hook == H.INGEST:
        if cfg.context_engine.stable_prefix_mode:
            return {"type": "ingest_result", "memories": []}
        return D.ingest(req, memory, cfg.context_engine.max_recall_results)
    if hook == H.ASSEMBLE:
        return D.assemble(req)
    if hook == H.COMPACT:
        return D.compact(req, summarizer)
    if hook == H.TRANSFORM_TOOL_RESULT:
        return {"type": "unchanged", "content": req.get("content"), "result": req.get("content")}
    return D.ok()


class HookPolicy:
    """Deadline and fallback over the same catalog and config caches the process's engine uses."""

    def __init__(self, catalog: Catalog, config: ConfigCache, memory: MemoryStore,
                 summarizer_for: Callable[[LlmConfig], Summarizer | None] = lambda cfg: None):
        self.catalog = catalog
        self.config = config
        self.memory = memory
        self.summarizer_for = summarizer_for

    def deadline_secs(self, hook: str) -> float:
        # each plugin's manifest looked up once (chain, then its timeouts): on the web tier this runs on the event loop
        return deadline_secs(hook, CallCatalog(self.catalog, manifests_only=True), self.config.get())

    def fallback(self, hook: str, request: dict[str, Any], reason: str) -> dict[str, Any]:
        """The agent's answer when no worker gave one: the default engine's result, `source` "default" and why."""
        cfg = self.config.get()
        req = normalise(hook, request, context_window_tokens=cfg.context_engine.context_window_tokens)
        out = {**default_result(hook, req, cfg, self.memory, self.summarizer_for(cfg.llm)), "source": "default"}
        if reason:
            out["fallback_reason"] = reason
        return out
