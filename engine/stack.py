"""The context engine as agents see it: the configured plugin or plugin_stack, with the default engine as the
fallback for every failure. Per-hook stack semantics follow DESIGN.md §4."""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine import default_engine as D
from engine import hooks as H
from engine.catalog import Catalog
from engine.config import ConfigCache, LlmConfig, ServiceConfig
from engine.home import Home
from engine.invoke import Attempt, invoke
from engine.ports import (
    InvocationSink,
    MemoryStore,
    NullInvocationSink,
    NullMemory,
    NullStderrSink,
    StderrSink,
    Summarizer,
)
from engine.requests import normalise

log = logging.getLogger("librefang.engine")


@dataclass
class EngineReply:
    result: dict[str, Any]
    source: str  # the plugin(s) whose output is in the result, or "default"
    fallback_reason: str | None = None
    trace_ids: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = {**self.result, "source": self.source}
        if self.fallback_reason:
            out["fallback_reason"] = self.fallback_reason
        if self.trace_ids:
            out["trace_ids"] = self.trace_ids
        if self.warnings:
            out["warnings"] = self.warnings
        return out


@dataclass
class EngineDeps:
    home: Home
    memory: MemoryStore = field(default_factory=NullMemory)
    invocations: InvocationSink = field(default_factory=NullInvocationSink)
    stderr: StderrSink = field(default_factory=NullStderrSink)
    summarizer_for: Callable[[LlmConfig], Summarizer | None] = lambda cfg: None


class ContextEngine:
    def __init__(self, deps: EngineDeps, catalog: Catalog | None = None, config: ConfigCache | None = None):
        self.deps = deps
        self.home = deps.home
        self.catalog = catalog or Catalog(deps.home)
        self.config = config or ConfigCache(deps.home.config_path)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="stack")

    # ---- what the web tier needs before it enqueues ----

    def chain(self, cfg: ServiceConfig | None = None) -> list[str]:
        """Configured plugins that are installed and enabled, in order."""
        cfg = cfg or self.config.get()
        out = []
        for name in cfg.context_engine.chain:
            if self.catalog.exists(name) and self.catalog.get(name).enabled:
                out.append(name)
        return out

    def deadline_secs(self, hook: str) -> float:
        """How long an agent may wait for `hook`: the slowest layer's timeout (bootstrap 2×)."""
        timeouts = [30.0]
        for name in self.chain():
            plugin = self.catalog.get(name).plugin
            if plugin is not None:
                timeouts.append(plugin.manifest.hooks.hook_timeout_secs)
        base = max(timeouts) if len(timeouts) > 1 else timeouts[0]
        return base * (2 if hook == H.BOOTSTRAP else 1)

    # ---- answering ----

    def handle(self, hook: str, request: dict[str, Any], job_id: str | None = None) -> EngineReply:
        cfg = self.config.get()
        ce = cfg.context_engine
        req = normalise(hook, request, after_turn_max_chars=ce.after_turn_max_chars,
                        context_window_tokens=ce.context_window_tokens)
        chain = self.chain(cfg)
        handler = getattr(self, f"_{hook}")
        return handler(req, chain, cfg, job_id)

    def default(self, hook: str, request: dict[str, Any], reason: str | None = None) -> EngineReply:
        """The built-in engine's answer, e.g. when the worker missed the deadline."""
        cfg = self.config.get()
        req = normalise(hook, request, context_window_tokens=cfg.context_engine.context_window_tokens)
        return EngineReply(self._default_result(hook, req, cfg), "default", reason)

    def _default_result(self, hook: str, req: dict, cfg: ServiceConfig) -> dict:
        if hook == H.INGEST:
            if cfg.context_engine.stable_prefix_mode:
                return {"type": "ingest_result", "memories": []}
            return D.ingest(req, self.deps.memory, cfg.context_engine.max_recall_results)
        if hook == H.ASSEMBLE:
            return D.assemble(req)
        if hook == H.COMPACT:
            return D.compact(req, self.deps.summarizer_for(cfg.llm))
        if hook == H.TRANSFORM_TOOL_RESULT:
            return {"type": "unchanged", "content": req.get("content"), "result": req.get("content")}
        return D.ok()

    def _run(self, name: str, hook: str, req: dict, cfg: ServiceConfig, job_id: str | None) -> Attempt | None:
        entry = self.catalog.get(name)
        plugin = entry.plugin
        if plugin is None or not plugin.manifest.hooks.script_for(hook):
            if plugin is None:
                # record a failed invocation so the operator sees why the plugin is not answering
                return invoke(entry, hook, req, home=self.home, invocations=self.deps.invocations,
                              stderr=self.deps.stderr, agent_id=str(req.get("agent_id") or ""), job_id=job_id)
            return None
        return invoke(entry, hook, req, home=self.home, invocations=self.deps.invocations, stderr=self.deps.stderr,
                      agent_id=str(req.get("agent_id") or req.get("parent_id") or ""), job_id=job_id,
                      allowed_env_vars=tuple(cfg.context_engine.allowed_env_vars))

    def _run_all_concurrently(self, names: list[str], hook: str, req: dict, cfg: ServiceConfig,
                              job_id: str | None) -> list[Attempt | None]:
        if len(names) <= 1:
            return [self._run(n, hook, req, cfg, job_id) for n in names]
        futures = [self._pool.submit(self._run, n, hook, req, cfg, job_id) for n in names]
        return [f.result() for f in futures]

    @staticmethod
    def _reason(attempts: list[Attempt]) -> str | None:
        failed = [a for a in attempts if not a.ok]
        if not failed:
            return None
        return "; ".join(f"{a.plugin}: {a.failure}" for a in failed)

    @staticmethod
    def _policy_abort(name_attempts: list[Attempt], catalog: Catalog) -> Attempt | None:
        for a in name_attempts:
            if not a.ok:
                plugin = catalog.get(a.plugin).plugin
                if plugin is not None and plugin.manifest.hooks.on_hook_failure == "abort":
                    return a
        return None

    # ---- hooks ----

    def _ingest(self, req: dict, chain: list[str], cfg: ServiceConfig, job_id: str | None) -> EngineReply:
        if cfg.context_engine.stable_prefix_mode:
            return EngineReply({"type": "ingest_result", "memories": []}, "default", "stable_prefix_mode")
        runnable = [n for n in chain if self._ingest_applies(n, req)]
        attempts = [a for a in self._run_all_concurrently(runnable, H.INGEST, req, cfg, job_id) if a is not None]
        default = D.ingest(req, self.deps.memory, cfg.context_engine.max_recall_results)
        weights = cfg.context_engine.plugin_stack_weights
        ok = sorted((a for a in attempts if a.ok), key=lambda a: -weights.get(a.plugin, 1.0))
        memories = list(default["memories"])
        for a in ok:
            memories += _memories_from(a.reply)
        source = ",".join(a.plugin for a in ok) or "default"
        return EngineReply({"type": "ingest_result", "memories": memories}, source, self._reason(attempts),
                           [a.trace_id for a in attempts])

    def _ingest_applies(self, name: str, req: dict) -> bool:
        import re

        plugin = self.catalog.get(name).plugin
        if plugin is None:
            return True
        s = plugin.manifest.hooks
        message = str(req.get("message") or "")
        if s.ingest_filter and s.ingest_filter not in message:
            return False
        if s.ingest_regex:
            try:
                if not re.search(s.ingest_regex, message):
                    return False
            except re.error:
                pass
        agent = str(req.get("agent_id") or "")
        return not (s.only_for_agent_ids and not any(x in agent for x in s.only_for_agent_ids))

    def _first_wins(self, hook: str, req: dict, chain: list[str], cfg: ServiceConfig, job_id: str | None,
                    accept: Callable[[Any], dict | None]) -> EngineReply:
        attempts: list[Attempt] = []
        for name in chain:
            a = self._run(name, hook, req, cfg, job_id)
            if a is None:
                continue
            attempts.append(a)
            if a.ok:
                result = accept(a.reply)
                if result is not None:
                    return EngineReply(result, name, None, [x.trace_id for x in attempts])
        reason = self._reason(attempts) or (f"no plugin returned a usable {hook} result" if attempts else None)
        return EngineReply(self._default_result(hook, req, cfg), "default", reason, [x.trace_id for x in attempts])

    def _assemble(self, req, chain, cfg, job_id):
        def accept(reply):
            msgs = _messages_from(reply)
            if not msgs:
                return None
            return {"type": "assemble_result", "messages": restore_pinned(req["messages"], msgs)}
        return self._first_wins(H.ASSEMBLE, req, chain, cfg, job_id, accept)

    def _compact(self, req, chain, cfg, job_id):
        def accept(reply):
            if not isinstance(reply, dict):
                return None
            msgs = _messages_from(reply)
            if not msgs:
                return None
            msgs = restore_pinned(req["messages"], msgs)
            summary = reply.get("summary") if isinstance(reply.get("summary"), str) else "plugin compaction"
            return {"type": "compact_result", "messages": msgs, "summary": summary,
                    "compacted_count": max(0, len(req["messages"]) - len(msgs)), "used_fallback": False}
        return self._first_wins(H.COMPACT, req, chain, cfg, job_id, accept)

    def _transform_tool_result(self, req, chain, cfg, job_id):
        def accept(reply):
            if not isinstance(reply, dict):
                return None
            if reply.get("type") == "skip":
                return None
            new = reply.get("result") if reply.get("type") == "transformed" else reply.get("content")
            if not isinstance(new, str):
                return None
            return {"type": "transformed", "content": new, "result": new}
        return self._first_wins(H.TRANSFORM_TOOL_RESULT, req, chain, cfg, job_id, accept)

    def _run_each(self, hook, req, chain, cfg, job_id, concurrent: bool = False) -> EngineReply:
        runs = (self._run_all_concurrently(chain, hook, req, cfg, job_id) if concurrent
                else [self._run(n, hook, req, cfg, job_id) for n in chain])
        attempts = [a for a in runs if a is not None]
        ok = [a for a in attempts if a.ok]
        result: dict[str, Any] = {"type": "ok"}
        return EngineReply(result, ",".join(a.plugin for a in ok) or "default", self._reason(attempts),
                           [a.trace_id for a in attempts])

    def _after_turn(self, req, chain, cfg, job_id):
        runs = self._run_all_concurrently(chain, H.AFTER_TURN, req, cfg, job_id)
        attempts = [a for a in runs if a is not None]
        for a in attempts:
            if a.ok and isinstance(a.reply, dict):
                self._apply_after_turn_reply(a, req, chain, cfg, job_id)
        ok = [a for a in attempts if a.ok]
        return EngineReply({"type": "ok"}, ",".join(a.plugin for a in ok) or "default", self._reason(attempts),
                           [a.trace_id for a in attempts])

    def _apply_after_turn_reply(self, a: Attempt, req: dict, chain: list[str], cfg: ServiceConfig,
                                job_id: str | None) -> None:
        """after_turn replies may carry memories (stored), log (logged) and events (to the others' on_event)."""
        reply = a.reply
        for m in reply.get("memories") or []:
            if isinstance(m, dict) and isinstance(m.get("content"), str):
                tags = [str(t) for t in (m.get("tags") or [])][:16]
                try:
                    self.deps.memory.remember(str(req.get("agent_id") or ""), req.get("peer_id"), m["content"],
                                              scope=",".join(tags) or "hook", tags=tags, source=a.plugin)
                except Exception:
                    log.warning("storing a memory from %s failed", a.plugin, exc_info=True)
        if isinstance(reply.get("log"), str):
            log.info("after_turn log from %s: %s", a.plugin, reply["log"][:512])
        events = reply.get("events")
        if isinstance(events, list) and len(chain) > 1:
            for ev in events:
                if not isinstance(ev, dict) or not isinstance(ev.get("name"), str):
                    continue
                event_req = {"event": {"name": ev["name"], "payload": ev.get("payload"), "source_plugin": a.plugin}}
                for other in chain:
                    if other != a.plugin:
                        self._run(other, H.ON_EVENT, event_req, cfg, job_id)

    def _bootstrap(self, req, chain, cfg, job_id):
        return self._run_each(H.BOOTSTRAP, req, chain, cfg, job_id)

    def _prepare_subagent(self, req, chain, cfg, job_id):
        return self._run_each(H.PREPARE_SUBAGENT, req, chain, cfg, job_id)

    def _merge_subagent(self, req, chain, cfg, job_id):
        return self._run_each(H.MERGE_SUBAGENT, req, chain, cfg, job_id)

    def _on_event(self, req, chain, cfg, job_id):
        return self._run_each(H.ON_EVENT, req, chain, cfg, job_id)

    # ---- one plugin, whatever the configuration (dashboard/API test-hook) ----

    def test_hook(self, name: str, hook: str, request: dict[str, Any]) -> Attempt:
        cfg = self.config.get()
        req = normalise(hook, request, after_turn_max_chars=cfg.context_engine.after_turn_max_chars,
                        context_window_tokens=cfg.context_engine.context_window_tokens)
        entry = self.catalog.get(name)
        return invoke(entry, hook, req, home=self.home, invocations=self.deps.invocations, stderr=self.deps.stderr,
                      agent_id=str(req.get("agent_id") or ""), retries=0)


def _memories_from(reply: Any) -> list[dict]:
    if not isinstance(reply, dict):
        return []
    out = []
    for m in reply.get("memories") or []:
        if isinstance(m, dict) and isinstance(m.get("content"), str):
            out.append({**m, "scope": m.get("scope", "hook")})
    return out


def _messages_from(reply: Any) -> list[dict]:
    if not isinstance(reply, dict):
        return []
    msgs = reply.get("messages")
    if not isinstance(msgs, list):
        return []
    return [m for m in msgs if isinstance(m, dict) and m.get("role") in ("system", "user", "assistant")
            and isinstance(m.get("content"), (str, list))]


def restore_pinned(original: list[dict], result: list[dict]) -> list[dict]:
    """Put back any pinned message a plugin dropped, in its original relative order."""
    def key(m: dict) -> str:
        import json

        return json.dumps([m.get("role"), m.get("content")], sort_keys=True, default=str)

    present = {key(m) for m in result}
    missing = [(i, m) for i, m in enumerate(original) if isinstance(m, dict) and m.get("pinned") and key(m) not in present]
    if not missing:
        return result
    out = list(result)
    for _, m in missing:
        # insert before the first result message that came after it in the original, else append
        out.insert(_insert_at(original, m, out, key), m)
    return out


def _insert_at(original: list[dict], pinned: dict, out: list[dict], key) -> int:
    orig_keys = [key(m) for m in original]
    pos = orig_keys.index(key(pinned))
    later = set(orig_keys[pos + 1:])
    for idx, m in enumerate(out):
        if key(m) in later:
            return idx
    return len(out)
