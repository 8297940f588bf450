"""The context engine as agents see it: the configured plugin or plugin_stack, with the default engine as the
fallback for every failure. Per-hook stack semantics, and where they differ from LibreFang: docs/compatibility.md."""

from __future__ import annotations

import concurrent.futures
import contextvars
import hashlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine import default_engine as D
from engine import hooks as H
from engine import protocol as P
from engine.catalog import Catalog
from engine.config import ConfigCache, LlmConfig, ServiceConfig
from engine.home import Home
from engine.invoke import Attempt, Judge, Overrides, invoke, retry_delay_ms
from engine.ports import (
    TEST_CONSOLE,
    InvocationSink,
    MemoryStore,
    NullInvocationSink,
    NullMemory,
    NullStderrSink,
    OriginSink,
    StderrSink,
    Summarizer,
)
from engine.requests import normalise
from engine.runner import HookResult

log = logging.getLogger("librefang.engine")


@dataclass
class EngineReply:
    result: dict[str, Any]
    source: str  # the plugin(s) whose output is in the result, or "default"
    fallback_reason: str | None = None
    trace_ids: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # on_hook_failure = "abort": the agent must get an error, not a fallback. `error` says which plugin and why.
    aborted: bool = False
    error: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {**self.result, "source": self.source}
        if self.fallback_reason:
            out["fallback_reason"] = self.fallback_reason
        if self.trace_ids:
            out["trace_ids"] = self.trace_ids
        if self.warnings:
            out["warnings"] = self.warnings
        if self.aborted:
            out["aborted"] = True
            out["error"] = self.error
        return out


@dataclass
class EngineDeps:
    home: Home
    memory: MemoryStore = field(default_factory=NullMemory)
    invocations: InvocationSink = field(default_factory=NullInvocationSink)
    stderr: StderrSink = field(default_factory=NullStderrSink)
    summarizer_for: Callable[[LlmConfig], Summarizer | None] = lambda cfg: None


class TtlCache:
    """Per-hook reply cache (hook_cache_ttl_secs, assemble_cache_ttl_secs, compact_cache_ttl_secs), in memory per
    worker process, keyed by plugin and the SHA-256 of the request JSON (LibreFang's scheme)."""

    MAX_ENTRIES = 512

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._data: dict[tuple[str, str, str], tuple[float, Any]] = {}
        self._lock = threading.Lock()
        self.clock = clock

    @staticmethod
    def key(plugin: str, hook: str, request: dict) -> tuple[str, str, str]:
        digest = hashlib.sha256(json.dumps(request, sort_keys=True, default=str).encode()).hexdigest()
        return (plugin, hook, digest)

    def get(self, key: tuple[str, str, str]) -> Any:
        with self._lock:
            hit = self._data.get(key)
            if hit is None:
                return None
            if hit[0] <= self.clock():
                del self._data[key]
                return None
            return hit[1]

    def put(self, key: tuple[str, str, str], value: Any, ttl: float) -> None:
        with self._lock:
            now = self.clock()
            if len(self._data) >= self.MAX_ENTRIES:
                for k in [k for k, (exp, _) in self._data.items() if exp <= now]:
                    del self._data[k]
                while len(self._data) >= self.MAX_ENTRIES:
                    self._data.pop(next(iter(self._data)))
            self._data[key] = (now + ttl, value)

    def clear(self, plugin: str | None = None) -> None:
        with self._lock:
            for k in [k for k in self._data if plugin is None or k[0] == plugin]:
                del self._data[k]


class CircuitBreakers:
    """`circuit_breaker = {max_failures, reset_secs}`: after max_failures consecutive failures of one plugin's hook
    for one agent, calls fail fast (circuit_open) until reset_secs pass; then one probe call decides. In memory per
    worker process (LibreFang persists it in SQLite; a worker restart closes every circuit here)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._state: dict[tuple[str, str, str], tuple[int, float]] = {}  # key -> (consecutive failures, opened at)
        self._lock = threading.Lock()

    def check(self, key: tuple[str, str, str], max_failures: int, reset_secs: float) -> str | None:
        """None when the call may go ahead; otherwise why it may not."""
        with self._lock:
            failures, opened = self._state.get(key, (0, 0.0))
            if failures < max_failures:
                return None
            remaining = opened + reset_secs - self.clock()
            if remaining <= 0:
                self._state[key] = (failures, self.clock())  # half-open: this call is the probe
                return None
            return f"circuit open after {failures} consecutive failures; retrying in {remaining:.0f}s"

    def record(self, key: tuple[str, str, str], ok: bool) -> None:
        with self._lock:
            if ok:
                self._state.pop(key, None)
            else:
                failures, _ = self._state.get(key, (0, 0.0))
                self._state[key] = (failures + 1, self.clock())


CACHE_TTL_FIELD = {H.INGEST: "hook_cache_ttl_secs", H.ASSEMBLE: "assemble_cache_ttl_secs",
                   H.COMPACT: "compact_cache_ttl_secs"}
# Hooks that carry an agent id and honour only_for_agent_ids (LibreFang: ingest, assemble, compact, after_turn,
# transform_tool_result).
AGENT_FILTERED_HOOKS = frozenset({H.INGEST, H.ASSEMBLE, H.COMPACT, H.AFTER_TURN, H.TRANSFORM_TOOL_RESULT})
# Hooks whose failure may abort the agent's call under on_hook_failure = "abort". LibreFang ignores abort for
# bootstrap (`let _ =`) and after_turn is fire-and-forget.
ABORTABLE_HOOKS = frozenset({H.INGEST, H.ASSEMBLE, H.COMPACT, H.TRANSFORM_TOOL_RESULT, H.PREPARE_SUBAGENT,
                             H.MERGE_SUBAGENT})


class ContextEngine:
    def __init__(self, deps: EngineDeps, catalog: Catalog | None = None, config: ConfigCache | None = None):
        self.deps = deps
        self.home = deps.home
        self.catalog = catalog or Catalog(deps.home)
        self.config = config or ConfigCache(deps.home.config_path)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="stack")
        self.cache = TtlCache()
        self.breakers = CircuitBreakers()
        self._lock = threading.Lock()
        # bootstrap overrides per plugin: stored in the plugin's data dir so every worker process sharing this
        # LIBREFANG_HOME applies them (LibreFang keeps them in its single daemon's memory); re-read on change.
        self._overrides: dict[str, tuple[tuple, Overrides | None]] = {}
        self._sleep: Callable[[float], None] = time.sleep

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
        """How long an agent may wait for `hook`: every layer's timeout with its retries (bootstrap 2x); layers of
        sequential hooks add up, ingest layers run concurrently. 30 s when no plugin serves."""
        budgets = []
        for name in self.chain():
            plugin = self.catalog.get(name).plugin
            if plugin is None or not plugin.manifest.hooks.script_for(hook):
                continue
            s = plugin.manifest.hooks
            timeout = s.hook_timeout_secs * (2 if hook == H.BOOTSTRAP else 1)
            delays = sum(retry_delay_ms(s.retry_delay_ms, n) for n in range(1, s.max_retries + 1)) / 1000
            budgets.append(timeout * (1 + s.max_retries) + delays)
        if not budgets:
            return 30.0 * (2 if hook == H.BOOTSTRAP else 1)
        return max(budgets) if hook in (H.INGEST, H.AFTER_TURN) else sum(budgets)

    # ---- answering ----

    def handle(self, hook: str, request: dict[str, Any], job_id: str | None = None) -> EngineReply:
        if not H.is_hook(hook):
            raise ValueError(f"unknown hook {hook!r}; hooks are: {', '.join(H.ALL_HOOKS)}")
        cfg = self.config.get()
        ce = cfg.context_engine
        req = normalise(hook, request, after_turn_max_chars=ce.after_turn_max_chars,
                        context_window_tokens=ce.context_window_tokens)
        chain = self.chain(cfg)
        handler = getattr(self, f"_{hook}")
        reply = handler(req, chain, cfg, job_id)
        if reply.source == "default" and not reply.fallback_reason and not reply.aborted:
            # a configured plugin that is disabled or uninstalled is a fallback too: say so to the agent
            skipped = self.skipped_layers(cfg)
            if skipped and not (hook == H.INGEST and cfg.context_engine.stable_prefix_mode):
                reply.fallback_reason = "; ".join(skipped)
        if reply.fallback_reason and not reply.aborted:
            if reply.source == "default":
                log.warning("%s fell back to the default engine: %s", hook, reply.fallback_reason)
            else:  # a later stack layer answered: not a fallback to the default engine
                log.warning("%s answered by %s after earlier layers failed: %s", hook, reply.source,
                            reply.fallback_reason)
        return reply

    def skipped_layers(self, cfg: ServiceConfig | None = None) -> list[str]:
        """Why configured plugins are not in the chain: `plugin_disabled: x is disabled`, `plugin_not_installed: …`."""
        cfg = cfg or self.config.get()
        out = []
        for name in cfg.context_engine.chain:
            if not self.catalog.exists(name):
                out.append(f"plugin_not_installed: {name} is not installed")
            elif not self.catalog.get(name).enabled:
                out.append(f"plugin_disabled: {name} is disabled")
        return out

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

    def _applies(self, name: str, hook: str, req: dict) -> bool:
        """The plugin's filters: ingest_filter / ingest_regex (ingest) and only_for_agent_ids."""
        plugin = self.catalog.get(name).plugin
        if plugin is None:
            return True
        s = plugin.manifest.hooks
        if hook == H.INGEST:
            message = str(req.get("message") or "")
            override = self.overrides_for(name)
            substring = override.ingest_filter if override and override.ingest_filter is not None else s.ingest_filter
            if substring and substring not in message:
                return False
            if s.ingest_regex:
                try:
                    if not re.search(s.ingest_regex, message):
                        return False
                except re.error:
                    pass  # invalid pattern: ignored (and reported as a finding), as LibreFang does
        if hook in AGENT_FILTERED_HOOKS and s.only_for_agent_ids:
            agent = str(req.get("agent_id") or "")
            return any(x in agent for x in s.only_for_agent_ids)
        return True

    def _run(self, name: str, hook: str, req: dict, cfg: ServiceConfig, job_id: str | None,
             judge: Judge | None = None) -> Attempt | None:
        """One layer. None: the plugin does not take part (hook not declared, or filtered out)."""
        entry = self.catalog.get(name)
        plugin = entry.plugin
        agent = str(req.get("agent_id") or req.get("parent_id") or "")
        if plugin is None:
            # record a failed invocation so the operator sees why the plugin is not answering
            return invoke(entry, hook, req, home=self.home, invocations=self.deps.invocations,
                          stderr=self.deps.stderr, agent_id=agent, job_id=job_id)
        if not plugin.manifest.hooks.script_for(hook) or not self._applies(name, hook, req):
            return None
        ttl_field = CACHE_TTL_FIELD.get(hook)
        ttl = getattr(plugin.manifest.hooks, ttl_field) if ttl_field else None
        key = TtlCache.key(name, hook, {"fingerprint": list(plugin.fingerprint), "request": req}) if ttl else None
        if key is not None:
            hit = self.cache.get(key)
            if hit is not None:
                return Attempt(name, hook, hit, "", cached=True)
        breaker = plugin.manifest.hooks.circuit_breaker
        bkey = (name, agent, hook)
        if breaker is not None:
            why = self.breakers.check(bkey, breaker.max_failures, breaker.reset_secs)
            if why is not None:
                return Attempt(name, hook, HookResult(False, failure=P.Failure(P.CIRCUIT_OPEN, why)), "")
        attempt = invoke(entry, hook, req, home=self.home, invocations=self.deps.invocations, stderr=self.deps.stderr,
                         agent_id=agent, job_id=job_id, allowed_env_vars=tuple(cfg.context_engine.allowed_env_vars),
                         overrides=self.overrides_for(name), judge=judge, sleep=self._sleep)
        if breaker is not None:
            self.breakers.record(bkey, attempt.ok)
        if key is not None and attempt.ok and ttl:
            self.cache.put(key, attempt.result, float(ttl))
        return attempt

    def _run_all_concurrently(self, names: list[str], hook: str, req: dict, cfg: ServiceConfig,
                              job_id: str | None) -> list[Attempt | None]:
        if len(names) <= 1:
            return [self._run(n, hook, req, cfg, job_id) for n in names]
        # each in a copy of this thread's context, so the caller's origin (engine.ports.CURRENT_ORIGIN) stays on
        futures = [self._pool.submit(contextvars.copy_context().run, self._run, n, hook, req, cfg, job_id)
                   for n in names]
        return [f.result() for f in futures]

    def _policy(self, name: str) -> str:
        plugin = self.catalog.get(name).plugin
        return plugin.manifest.hooks.on_hook_failure if plugin is not None else "warn"

    def _reason(self, attempts: list[Attempt]) -> str | None:
        """Why the answer is (partly) the default's. Failures of `skip` plugins stay silent."""
        failed = [a for a in attempts if not a.ok and self._policy(a.plugin) != "skip"]
        if not failed:
            return None
        return "; ".join(f"{a.plugin}: {a.failure}" for a in failed)

    def _abort(self, hook: str, attempts: list[Attempt]) -> EngineReply | None:
        if hook not in ABORTABLE_HOOKS:
            return None
        for a in attempts:
            # an unusable reply (e.g. an empty assemble list) falls back even under abort, as in LibreFang
            if not a.ok and self._policy(a.plugin) == "abort" and a.failure and a.failure.kind != P.INVALID_OUTPUT:
                failure = a.failure or P.Failure(P.ABORTED, "hook failed")
                return EngineReply({"type": "error"}, a.plugin, None, [x.trace_id for x in attempts if x.trace_id],
                                   aborted=True, error={"kind": P.ABORTED, "plugin": a.plugin, "hook": hook,
                                                        "cause": failure.kind, "message": failure.message})
        return None

    @staticmethod
    def _trace_ids(attempts: list[Attempt]) -> list[str]:
        return [a.trace_id for a in attempts if a.trace_id]

    # ---- hooks ----

    def _ingest(self, req: dict, chain: list[str], cfg: ServiceConfig, job_id: str | None) -> EngineReply:
        if cfg.context_engine.stable_prefix_mode:
            # LibreFang: neither the hooks nor the default recall run in stable-prefix mode.
            return EngineReply({"type": "ingest_result", "memories": []}, "default", None)
        attempts = [a for a in self._run_all_concurrently(chain, H.INGEST, req, cfg, job_id) if a is not None]
        aborted = self._abort(H.INGEST, attempts)
        if aborted:
            return aborted
        default = D.ingest(req, self.deps.memory, cfg.context_engine.max_recall_results)  # once, not per layer
        weights = cfg.context_engine.plugin_stack_weights
        ok = sorted((a for a in attempts if a.ok), key=lambda a: -weights.get(a.plugin, 1.0))  # stable sort
        memories = list(default["memories"])
        for a in ok:
            memories += _memories_from(a.reply, "hook_cached" if a.cached else "hook")
        source = ",".join(a.plugin for a in ok) or "default"
        return EngineReply({"type": "ingest_result", "memories": memories}, source, self._reason(attempts),
                           self._trace_ids(attempts))

    def _first_wins(self, hook: str, req: dict, chain: list[str], cfg: ServiceConfig, job_id: str | None,
                    accept: Callable[[Any], tuple[dict | None, str | None, list[str]]],
                    count_unusable_as_failure: bool) -> EngineReply:
        """Layers in order; the first usable result wins. `accept(reply)` -> (result, problem, warnings)."""
        attempts: list[Attempt] = []
        accepted: dict[int, tuple[dict | None, list[str]]] = {}

        def judge(reply: Any) -> tuple[str | None, list[str]]:
            result, problem, warnings = accept(reply)
            accepted[id(reply)] = (result, warnings)
            return (problem if count_unusable_as_failure else None), warnings

        for name in chain:
            a = self._run(name, hook, req, cfg, job_id, judge)
            if a is None:
                continue
            attempts.append(a)
            if a.ok:
                result, warnings = accepted.get(id(a.reply)) or accept(a.reply)[::2]
                if result is not None:
                    return EngineReply(result, name, self._reason(attempts[:-1]), self._trace_ids(attempts),
                                       list(warnings))
            else:
                aborted = self._abort(hook, [a])
                if aborted is not None:
                    aborted.trace_ids = self._trace_ids(attempts)
                    return aborted
        reason = self._reason(attempts)
        if reason is None and any(a.ok for a in attempts):
            reason = f"no plugin returned a usable {hook} result"
        return EngineReply(self._default_result(hook, req, cfg), "default", reason, self._trace_ids(attempts))

    def _assemble(self, req, chain, cfg, job_id):
        return self._first_wins(H.ASSEMBLE, req, chain, cfg, job_id, self._accept_assemble(req),
                                count_unusable_as_failure=True)

    @staticmethod
    def _accept_assemble(req):
        def accept(reply):
            msgs = _messages_from(reply)
            if not msgs:
                return None, "assemble returned no usable messages", []
            restored, warnings = restore_pinned(req["messages"], msgs)
            return {"type": "assemble_result", "messages": restored, "recovery_stage": "none"}, None, warnings
        return accept

    def _compact(self, req, chain, cfg, job_id):
        return self._first_wins(H.COMPACT, req, chain, cfg, job_id, self._accept_compact(req, cfg),
                                count_unusable_as_failure=True)

    def _accept_compact(self, req, cfg):
        summarizer = self.deps.summarizer_for(cfg.llm)

        def accept(reply):
            if not isinstance(reply, dict):
                return None, "compact returned no usable result", []
            via_llm = self._llm_summary(req, reply, summarizer)
            if via_llm is not None:
                return via_llm
            msgs = _messages_from(reply)
            if not msgs:
                return None, "compact returned no usable messages", []
            restored, warnings = restore_pinned(req["messages"], msgs)
            summary = reply.get("summary") if isinstance(reply.get("summary"), str) and reply.get("summary") \
                else "plugin compaction"
            return ({"type": "compact_result", "messages": restored, "summary": summary,
                     "compacted_count": max(0, len(req["messages"]) - len(msgs)), "used_fallback": False},
                    None, warnings)
        return accept

    @staticmethod
    def _llm_summary(req: dict, reply: dict, summarizer: Summarizer | None):
        """`request_llm_summary`: the host's LLM summarises `summarize`; `keep` stays verbatim. None: not usable."""
        directive = reply.get("request_llm_summary")
        if not isinstance(directive, dict):
            return None
        summarize = [m for m in (directive.get("summarize") or []) if isinstance(m, dict)]
        keep = _messages_from({"messages": directive.get("keep") or []})
        if not summarize or summarizer is None:
            return None
        max_tokens = directive.get("max_tokens") if isinstance(directive.get("max_tokens"), int) else 2048
        prompt = directive.get("prompt") if isinstance(directive.get("prompt"), str) else None
        try:
            summary = summarizer.summarize(D.render_for_summary(summarize), max_tokens, prompt).strip()
        except Exception as exc:
            log.warning("request_llm_summary: the LLM call failed: %s", exc)
            return None
        if not summary:
            return None
        restored, warnings = restore_pinned(req["messages"], keep)
        return ({"type": "compact_result", "messages": restored, "summary": summary,
                 "compacted_count": len(summarize), "used_fallback": False}, None, warnings)

    def _transform_tool_result(self, req, chain, cfg, job_id):
        reply = self._first_wins(H.TRANSFORM_TOOL_RESULT, req, chain, cfg, job_id, self._accept_transform(),
                                 count_unusable_as_failure=False)
        if reply.source == "default" and reply.fallback_reason and reply.fallback_reason.startswith("no plugin"):
            reply.fallback_reason = None  # every layer passed: that is not a failure
        return reply

    @staticmethod
    def _accept_transform():
        def accept(reply):
            if not isinstance(reply, dict) or reply.get("type") == "skip":
                return None, None, []
            new = reply.get("result") if reply.get("type") == "transformed" and "result" in reply \
                else reply.get("content")
            if new is None:
                return None, None, []  # no change, still a success (LibreFang)
            if not isinstance(new, str):
                new = json.dumps(new, ensure_ascii=False)
            return {"type": "transformed", "content": new, "result": new}, None, []
        return accept

    def _run_each(self, hook, req, chain, cfg, job_id) -> EngineReply:
        """bootstrap, prepare/merge_subagent, on_event: all run in order; failures logged; the chain continues."""
        attempts = [a for a in (self._run(n, hook, req, cfg, job_id) for n in chain) if a is not None]
        aborted = self._abort(hook, attempts)
        if aborted:
            return aborted
        ok = [a for a in attempts if a.ok]
        return EngineReply({"type": "ok"}, ",".join(a.plugin for a in ok) or "default", self._reason(attempts),
                           self._trace_ids(attempts))

    def _after_turn(self, req, chain, cfg, job_id):
        runs = self._run_all_concurrently(chain, H.AFTER_TURN, req, cfg, job_id)
        attempts = [a for a in runs if a is not None]
        stored = 0
        for a in attempts:
            if a.ok and isinstance(a.reply, dict):
                stored += self._apply_after_turn_reply(a, req, chain, cfg, job_id)
        ok = [a for a in attempts if a.ok]
        if not ok:  # the default engine answered: it remembers the turn (engine/default_engine.py after_turn)
            D.after_turn(req, self.deps.memory)
        return EngineReply({"type": "ok", "memories_stored": stored}, ",".join(a.plugin for a in ok) or "default",
                           self._reason(attempts), self._trace_ids(attempts))

    def _apply_after_turn_reply(self, a: Attempt, req: dict, chain: list[str], cfg: ServiceConfig,
                                job_id: str | None) -> int:
        """after_turn replies may carry memories (stored), log (logged), annotations (on the trace, see invoke)
        and events (to the other stack members' on_event; only in a stack, self-events skipped)."""
        reply = a.reply
        stored = 0
        memories = reply.get("memories")
        for m in memories if isinstance(memories, list) else []:
            if isinstance(m, dict) and isinstance(m.get("content"), str) and m["content"].strip():
                tags = [str(t) for t in (m.get("tags") or []) if isinstance(t, str | int | float)][:16] \
                    if isinstance(m.get("tags"), list) else []
                try:
                    self.deps.memory.remember(str(req.get("agent_id") or ""), req.get("peer_id"), m["content"],
                                              scope=",".join(tags) or "hook", tags=tags, source=a.plugin)
                    stored += 1
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
                        # best-effort, no retries, output ignored (LibreFang)
                        self._run(other, H.ON_EVENT, event_req, cfg, job_id)
        return stored

    def _bootstrap(self, req, chain, cfg, job_id):
        attempts = [a for a in (self._run(n, H.BOOTSTRAP, req, cfg, job_id) for n in chain) if a is not None]
        for a in attempts:
            if a.ok and isinstance(a.reply, dict):
                self._apply_bootstrap_overrides(a.plugin, a.reply)
        ok = [a for a in attempts if a.ok]
        return EngineReply({"type": "ok"}, ",".join(a.plugin for a in ok) or "default", self._reason(attempts),
                           self._trace_ids(attempts))

    def _apply_bootstrap_overrides(self, plugin: str, reply: dict) -> None:
        o = Overrides()
        if isinstance(reply.get("env_overrides"), dict):
            o.env = {str(k): str(v) for k, v in reply["env_overrides"].items() if v is not None}
        if isinstance(reply.get("ingest_filter"), str):
            o.ingest_filter = reply["ingest_filter"]
        if isinstance(reply.get("allow_network"), bool):
            o.allow_network = reply["allow_network"]
        path = self._overrides_path(plugin)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{threading.get_ident()}")
            tmp.write_text(json.dumps({"env_overrides": o.env, "ingest_filter": o.ingest_filter,
                                       "allow_network": o.allow_network}))
            tmp.replace(path)
        except OSError:
            log.warning("cannot store bootstrap overrides of %s", plugin, exc_info=True)
        with self._lock:
            self._overrides[plugin] = (_stamp(path), o)
        self.cache.clear(plugin)

    def _overrides_path(self, plugin: str):
        return self.home.data_dir(plugin) / "bootstrap_overrides.json"

    def overrides_for(self, plugin: str) -> Overrides | None:
        """What the plugin's last bootstrap reply changed (None: no bootstrap override). One stat per call."""
        path = self._overrides_path(plugin)
        stamp = _stamp(path)
        with self._lock:
            cached = self._overrides.get(plugin)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        value = None
        if stamp:
            try:
                raw = json.loads(path.read_text())
                value = Overrides(env={str(k): str(v) for k, v in (raw.get("env_overrides") or {}).items()},
                                  ingest_filter=raw.get("ingest_filter") if isinstance(raw.get("ingest_filter"), str)
                                  else None,
                                  allow_network=raw.get("allow_network") if isinstance(raw.get("allow_network"), bool)
                                  else None)
            except (OSError, ValueError, AttributeError):
                value = None
        with self._lock:
            self._overrides[plugin] = (stamp, value)
        return value

    def _prepare_subagent(self, req, chain, cfg, job_id):
        return self._run_each(H.PREPARE_SUBAGENT, req, chain, cfg, job_id)

    def _merge_subagent(self, req, chain, cfg, job_id):
        return self._run_each(H.MERGE_SUBAGENT, req, chain, cfg, job_id)

    def _on_event(self, req, chain, cfg, job_id):
        return self._run_each(H.ON_EVENT, req, chain, cfg, job_id)

    # ---- one plugin, whatever the configuration (dashboard/API test-hook) ----

    def judge_for(self, hook: str, req: dict, cfg: ServiceConfig | None = None) -> Judge | None:
        """The check an agent call applies to a plugin's reply before using it (None: every reply is used).
        The test console runs the same check, so it shows the same verdict and the same failure."""
        cfg = cfg or self.config.get()
        accept = {H.ASSEMBLE: lambda: self._accept_assemble(req), H.COMPACT: lambda: self._accept_compact(req, cfg),
                  H.TRANSFORM_TOOL_RESULT: self._accept_transform}.get(hook)
        if accept is None:
            return None
        check = accept()
        counts_as_failure = hook != H.TRANSFORM_TOOL_RESULT  # as in _first_wins

        def judge(reply: Any) -> tuple[str | None, list[str]]:
            _result, problem, warnings = check(reply)
            return (problem if counts_as_failure else None), warnings
        return judge

    def judge(self, hook: str, request: dict[str, Any], reply: Any) -> tuple[bool, str | None]:
        """(ok, reason): would an agent call use this reply of a plugin's `hook`? reason: why not."""
        cfg = self.config.get()
        req = normalise(hook, request, after_turn_max_chars=cfg.context_engine.after_turn_max_chars,
                        context_window_tokens=cfg.context_engine.context_window_tokens)
        check = self.judge_for(hook, req, cfg)
        problem = check(reply)[0] if check is not None else None
        return (problem is None), (f"{P.INVALID_OUTPUT}: {problem}" if problem else None)

    def test_hook(self, name: str, hook: str, request: dict[str, Any]) -> Attempt:
        """One run of a plugin's hook, judged exactly as an agent call judges it: a reply the engine would not use
        (e.g. assemble with no messages) comes back as an invalid_output failure, not as "ok"."""
        cfg = self.config.get()
        req = normalise(hook, request, after_turn_max_chars=cfg.context_engine.after_turn_max_chars,
                        context_window_tokens=cfg.context_engine.context_window_tokens)
        entry = self.catalog.get(name)
        # Recorded as test-console runs: kept out of the agents' Calls/Errors and percentiles.
        return invoke(entry, hook, req, home=self.home, invocations=OriginSink(self.deps.invocations, TEST_CONSOLE),
                      stderr=self.deps.stderr, agent_id=str(req.get("agent_id") or ""), retries=0,
                      overrides=self.overrides_for(name),
                      allowed_env_vars=tuple(cfg.context_engine.allowed_env_vars), judge=self.judge_for(hook, req, cfg))


def _stamp(path) -> tuple:
    try:
        st = os.stat(path)
    except OSError:
        return ()
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def _memories_from(reply: Any, scope: str = "hook") -> list[dict]:
    """`{"memories":[{"content": str, ...}]}`; `type` is never required. Other keys of an entry pass through."""
    if not isinstance(reply, dict) or not isinstance(reply.get("memories"), list):
        return []
    out = []
    for m in reply["memories"]:
        if isinstance(m, dict) and isinstance(m.get("content"), str):
            out.append({**m, "scope": scope})
    return out


def _messages_from(reply: Any) -> list[dict]:
    if not isinstance(reply, dict):
        return []
    msgs = reply.get("messages")
    if not isinstance(msgs, list):
        return []
    return [m for m in msgs if isinstance(m, dict) and m.get("role") in ("system", "user", "assistant")
            and isinstance(m.get("content"), (str, list))]


def restore_pinned(original: list[dict], result: list[dict]) -> tuple[list[dict], list[str]]:
    """Put back any pinned message a plugin dropped, in its original relative order; one warning per message."""
    def key(m: dict) -> str:
        return json.dumps([m.get("role"), m.get("content")], sort_keys=True, default=str)

    present = {key(m) for m in result}
    missing = [(i, m) for i, m in enumerate(original) if isinstance(m, dict) and m.get("pinned") and key(m) not in present]
    if not missing:
        return result, []
    out = list(result)
    warnings = []
    for i, m in missing:
        # insert before the first result message that came after it in the original, else append
        out.insert(_insert_at(original, m, out, key), m)
        warnings.append(f"pinned message #{i} ({m.get('role')}) was dropped by the plugin and has been restored")
    return out, warnings


def _insert_at(original: list[dict], pinned: dict, out: list[dict], key) -> int:
    orig_keys = [key(m) for m in original]
    pos = orig_keys.index(key(pinned))
    later = set(orig_keys[pos + 1:])
    for idx, m in enumerate(out):
        if key(m) in later:
            return idx
    return len(out)
