"""The context engine as agents see it: the configured plugin or plugin_stack, with the default engine as the
fallback for every failure. How the layers answer each hook is declared in engine/strategies.py (this module follows
that table); where it differs from LibreFang: docs/compatibility.md."""

from __future__ import annotations

import concurrent.futures
import contextvars
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine import default_engine as D
from engine import hook_policy as policy
from engine import hooks as H
from engine import protocol as P
from engine.config import ConfigCache, LlmConfig, ServiceConfig
from engine.home import Home
from engine.hook_requests import normalise
from engine.invoke import Attempt, Judge, Verdict, invoke
from engine.overrides import BootstrapOverrides, Overrides
from engine.plugins.catalog import CallCatalog, Catalog
from engine.plugins.permissions import Approvals, NoApprovals, PermissionPolicy
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
from engine.process.hook_call import HookResult
from engine.replies import apply_after_turn_reply, memories_from
from engine.resilience import CircuitBreakers, TtlCache
from engine.strategies import AFTER_TURN_REPLY, ALL, BOOTSTRAP_REPLY, FIRST_USABLE, MERGE, STRATEGIES

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
    # Which manifest versions an owner approved (engine/plugins/permissions.py); none: every plugin runs with the
    # defaults in place of what it asks.
    approvals: Approvals = field(default_factory=NoApprovals)


def for_plugins(hook: str, request: dict[str, Any], cfg: ServiceConfig) -> dict[str, Any]:
    """The request as the chain's plugins receive it, shaped by [context_engine] (engine/hook_requests.py)."""
    ce = cfg.context_engine
    return normalise(hook, request, after_turn_max_chars=ce.after_turn_max_chars,
                     context_window_tokens=ce.context_window_tokens)


class ContextEngine:
    def __init__(self, deps: EngineDeps, catalog: Catalog | None = None, config: ConfigCache | None = None):
        self.deps = deps
        self.home = deps.home
        self.catalog = catalog or Catalog(deps.home)
        self.config = config or ConfigCache(deps.home.config_path)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="stack")
        self.cache = TtlCache()
        self.breakers = CircuitBreakers()
        self.overrides = BootstrapOverrides(deps.home)
        self._sleep: Callable[[float], None] = time.sleep
        # one slot: the policy of the config in force
        self._permissions: list[tuple[ServiceConfig, PermissionPolicy]] = []

    def permissions(self, cfg: ServiceConfig) -> PermissionPolicy:
        """The operator's side of every call's grant (approvals, [limits], [plugin_env]), made once per config."""
        cached = self._permissions[0] if self._permissions else None
        if cached is None or cached[0] is not cfg:
            cached = (cfg, PermissionPolicy.of(cfg, self.deps.approvals))
            self._permissions[:] = [cached]
        return cached[1]

    # ---- what the web tier needs before it enqueues ----

    def chain(self, cfg: ServiceConfig | None = None) -> list[str]:
        """Configured plugins that are installed and enabled, in order."""
        return policy.chain(self.catalog, cfg or self.config.get())

    def deadline_secs(self, hook: str) -> float:
        """How long an agent may wait for `hook` (engine/hook_policy.py, the same rule the web tier uses)."""
        return policy.deadline_secs(hook, CallCatalog(self.catalog, manifests_only=True), self.config.get())

    def handle(self, hook: str, request: dict[str, Any], job_id: str | None = None) -> EngineReply:
        if not H.is_hook(hook):
            raise ValueError(f"unknown hook {hook!r}; hooks are: {', '.join(H.ALL_HOOKS)}")
        return ChainCall(self, hook, request, job_id).answer()

    def skipped_layers(self, cfg: ServiceConfig | None = None) -> list[str]:
        """Why configured plugins are not in the chain (engine/hook_policy.py)."""
        return policy.skipped_layers(self.catalog, cfg or self.config.get())

    def default(self, hook: str, request: dict[str, Any], reason: str | None = None) -> EngineReply:
        """The built-in engine's answer, e.g. when the worker missed the deadline."""
        cfg = self.config.get()
        req = normalise(hook, request, context_window_tokens=cfg.context_engine.context_window_tokens)
        return EngineReply(self.default_result(hook, req, cfg), "default", reason)

    def default_result(self, hook: str, req: dict, cfg: ServiceConfig) -> dict:
        return policy.default_result(hook, req, cfg, self.deps.memory, self.deps.summarizer_for(cfg.llm))

    def overrides_for(self, plugin: str) -> Overrides | None:
        """What the plugin's last bootstrap reply changed (None: no bootstrap override). One stat per call."""
        return self.overrides.get(plugin)

    # ---- one plugin, whatever the configuration (dashboard/API test-hook) ----

    def judge_for(self, hook: str, req: dict, cfg: ServiceConfig | None = None) -> Judge | None:
        """The check an agent call applies to a plugin's reply before using it (None: every reply is used).
        The test console runs the same check, so it shows the same verdict and the same failure."""
        cfg = cfg or self.config.get()
        strategy = STRATEGIES[hook]
        if strategy.accept is None:
            return None
        check = strategy.accept(req, lambda: self.deps.summarizer_for(cfg.llm))
        counts_as_failure = strategy.unusable_is_failure  # else an unusable reply is a pass: the next layer answers

        def judge(reply: Any) -> Verdict:
            result, problem, warnings = check(reply)
            return Verdict(result, problem if counts_as_failure else None, tuple(warnings))
        return judge

    def judge(self, hook: str, request: dict[str, Any], reply: Any) -> tuple[bool, str | None]:
        """(ok, reason): would an agent call use this reply of a plugin's `hook`? reason: why not."""
        cfg = self.config.get()
        req = for_plugins(hook, request, cfg)
        check = self.judge_for(hook, req, cfg)
        problem = check(reply).failure if check is not None else None
        return (problem is None), (f"{P.INVALID_OUTPUT}: {problem}" if problem else None)

    def test_hook(self, name: str, hook: str, request: dict[str, Any]) -> Attempt:
        """One run of a plugin's hook, judged exactly as an agent call judges it: a reply the engine would not use
        (e.g. assemble with no messages) comes back as an invalid_output failure, not as "ok"."""
        cfg = self.config.get()
        req = for_plugins(hook, request, cfg)
        entry = self.catalog.get(name)
        # Recorded as test-console runs: kept out of the agents' Calls/Errors and percentiles.
        return invoke(entry, hook, req, home=self.home, invocations=OriginSink(self.deps.invocations, TEST_CONSOLE),
                      stderr=self.deps.stderr, agent_id=str(req.get("agent_id") or ""), retries=0,
                      overrides=self.overrides.get(name),
                      allowed_env_vars=tuple(cfg.context_engine.allowed_env_vars), judge=self.judge_for(hook, req, cfg),
                      policy=self.permissions(cfg))


class ChainCall:
    """One agent call of a hook through the chain: the request as its plugins receive it, the configuration in force
    and the plugins as the call first looks each one up (a CallCatalog: one view of a plugin for the whole call:
    chain, filters, run, policy), and the three ways a chain answers (engine/strategies.py), one method each. The
    engine's own state (pools, reply cache, circuit breakers, bootstrap overrides) is shared by every call."""

    def __init__(self, engine: ContextEngine, hook: str, request: dict[str, Any], job_id: str | None):
        self.engine = engine
        self.hook = hook
        self.job_id = job_id
        self.cfg = engine.config.get()
        self.catalog = CallCatalog(engine.catalog)
        self.req = for_plugins(hook, request, self.cfg)
        self.chain = policy.chain(self.catalog, self.cfg)
        self.strategy = STRATEGIES[hook]

    def answer(self) -> EngineReply:
        run = {MERGE: self.merge, FIRST_USABLE: self.first_usable, ALL: self.all}[self.strategy.mode]
        reply = run()
        if reply.source == "default" and not reply.fallback_reason and not reply.aborted:
            # a configured plugin that is disabled or uninstalled is a fallback too: say so to the agent
            skipped = policy.skipped_layers(self.catalog, self.cfg)
            if skipped and not (self.hook == H.INGEST and self.cfg.context_engine.stable_prefix_mode):
                reply.fallback_reason = "; ".join(skipped)
        if reply.fallback_reason and not reply.aborted:
            if reply.source == "default":
                log.warning("%s fell back to the default engine: %s", self.hook, reply.fallback_reason)
            else:  # a later stack layer answered: not a fallback to the default engine
                log.warning("%s answered by %s after earlier layers failed: %s", self.hook, reply.source,
                            reply.fallback_reason)
        return reply

    # ---- the three ways a chain answers (engine/strategies.py) ----

    def merge(self) -> EngineReply:
        """ingest: every layer at once; their memories after the default engine's recall (run once, not per
        layer), the layers ordered by plugin_stack_weights."""
        ce = self.cfg.context_engine
        if ce.stable_prefix_mode:
            # LibreFang: neither the hooks nor the default recall run in stable-prefix mode.
            return EngineReply({"type": "ingest_result", "memories": []}, "default", None)
        attempts = [a for a in self.run_concurrently(self.chain) if a is not None]
        aborted = self.aborted(attempts)
        if aborted:
            return aborted
        default = D.ingest(self.req, self.engine.deps.memory, ce.max_recall_results)
        weights = ce.plugin_stack_weights
        ok = sorted((a for a in attempts if a.ok), key=lambda a: -weights.get(a.plugin, 1.0))  # stable sort
        memories = list(default["memories"])
        for a in ok:
            memories += memories_from(a.reply, "hook_cached" if a.cached else "hook")
        source = ",".join(a.plugin for a in ok) or "default"
        return EngineReply({"type": "ingest_result", "memories": memories}, source, self.reason(attempts),
                           _trace_ids(attempts), list(default.get("warnings", [])))

    def first_usable(self) -> EngineReply:
        """Layers in order; the first usable result wins (the strategy's `accept`, judged as each reply comes:
        engine/invoke.py Verdict), else the default engine answers."""
        judge = self.engine.judge_for(self.hook, self.req, self.cfg)
        attempts: list[Attempt] = []
        for name in self.chain:
            a = self.run(name, self.hook, self.req, judge)
            if a is None:
                continue
            attempts.append(a)
            if a.ok:
                if a.verdict is not None and a.verdict.result is not None:
                    return EngineReply(a.verdict.result, name, self.reason(attempts[:-1]), _trace_ids(attempts),
                                       list(a.verdict.warnings))
            else:
                aborted = self.aborted([a])
                if aborted is not None:
                    aborted.trace_ids = _trace_ids(attempts)
                    return aborted
        reason = self.reason(attempts)
        if reason is None and self.strategy.unusable_is_failure and any(a.ok for a in attempts):
            reason = f"no plugin returned a usable {self.hook} result"  # (a layer that passes is not a failure)
        return EngineReply(self.engine.default_result(self.hook, self.req, self.cfg), "default", reason,
                           _trace_ids(attempts))

    def all(self) -> EngineReply:
        """after_turn, bootstrap, prepare/merge_subagent, on_event: every layer runs (after_turn at once, the others
        in order); failures are logged and the chain goes on; `strategy.on_reply` uses each successful reply."""
        if self.strategy.concurrent:
            runs = self.run_concurrently(self.chain)
        else:
            runs = [self.run(n, self.hook, self.req) for n in self.chain]
        attempts = [a for a in runs if a is not None]
        aborted = self.aborted(attempts)
        if aborted:
            return aborted
        ok = [a for a in attempts if a.ok]
        result: dict[str, Any] = {"type": "ok"}
        if self.strategy.on_reply == AFTER_TURN_REPLY:
            result["memories_stored"] = sum(self.apply_after_turn_reply(a) for a in ok if isinstance(a.reply, dict))
            if not ok:  # the default engine answered: it remembers the turn (engine/default_engine.py after_turn)
                D.after_turn(self.req, self.engine.deps.memory)
        elif self.strategy.on_reply == BOOTSTRAP_REPLY:
            for a in ok:
                if isinstance(a.reply, dict):
                    self.engine.overrides.store(a.plugin, a.reply)
                    self.engine.cache.clear(a.plugin)
        return EngineReply(result, ",".join(a.plugin for a in ok) or "default", self.reason(attempts),
                           _trace_ids(attempts))

    def apply_after_turn_reply(self, a: Attempt) -> int:
        """What an after_turn reply carries beyond `ok` (engine/replies.py); its events go to the other stack
        members' on_event (only in a stack, self-events skipped; best-effort, no retries, output ignored:
        LibreFang)."""
        others = [n for n in self.chain if n != a.plugin] if len(self.chain) > 1 else []

        def forward(event_req: dict) -> None:
            for other in others:
                self.run(other, H.ON_EVENT, event_req)
        return apply_after_turn_reply(a.plugin, a.reply, self.req, self.engine.deps.memory,
                                      forward if others else None)

    # ---- one layer ----

    def run(self, name: str, hook: str, req: dict, judge: Judge | None = None) -> Attempt | None:
        """One layer. None: the plugin does not take part (hook not declared, or filtered out)."""
        engine = self.engine
        entry = self.catalog.get(name)
        plugin = entry.plugin
        agent = str(req.get("agent_id") or req.get("parent_id") or "")
        if plugin is None:
            # record a failed invocation so the operator sees why the plugin is not answering
            return invoke(entry, hook, req, home=engine.home, invocations=engine.deps.invocations,
                          stderr=engine.deps.stderr, agent_id=agent, job_id=self.job_id)
        if not plugin.manifest.hooks.script_for(hook) or not self.applies(name, hook, req):
            return None
        ttl_field = STRATEGIES[hook].cache_ttl_field
        ttl = getattr(plugin.manifest.hooks, ttl_field) if ttl_field else None
        key = TtlCache.key(name, hook, {"fingerprint": list(plugin.fingerprint), "request": req}) if ttl else None
        if key is not None:
            hit = engine.cache.get(key)
            if hit is not None:
                return Attempt(name, hook, hit, "", cached=True, verdict=judge(hit.reply) if judge else None)
        breaker = plugin.manifest.hooks.circuit_breaker
        bkey = (name, agent, hook)
        if breaker is not None:
            why = engine.breakers.check(bkey, breaker.max_failures, breaker.reset_secs)
            if why is not None:
                return Attempt(name, hook, HookResult(False, failure=P.Failure(P.CIRCUIT_OPEN, why)), "")
        attempt = invoke(entry, hook, req, home=engine.home, invocations=engine.deps.invocations,
                         stderr=engine.deps.stderr, agent_id=agent, job_id=self.job_id,
                         allowed_env_vars=tuple(self.cfg.context_engine.allowed_env_vars),
                         overrides=engine.overrides.get(name), judge=judge, sleep=engine._sleep,
                         policy=engine.permissions(self.cfg))
        if breaker is not None:
            engine.breakers.record(bkey, attempt.ok)
        if key is not None and attempt.ok and ttl:
            engine.cache.put(key, attempt.result, float(ttl))
        return attempt

    def run_concurrently(self, names: list[str]) -> list[Attempt | None]:
        if len(names) <= 1:
            return [self.run(n, self.hook, self.req) for n in names]
        # each in a copy of this thread's context, so the caller's origin (engine.ports.CURRENT_ORIGIN) stays on
        futures = [self.engine._pool.submit(contextvars.copy_context().run, self.run, n, self.hook, self.req)
                   for n in names]
        return [f.result() for f in futures]

    def applies(self, name: str, hook: str, req: dict) -> bool:
        """The plugin's filters: ingest_filter / ingest_regex (ingest) and only_for_agent_ids."""
        plugin = self.catalog.get(name).plugin
        if plugin is None:
            return True
        s = plugin.manifest.hooks
        if hook == H.INGEST:
            message = str(req.get("message") or "")
            override = self.engine.overrides.get(name)
            substring = override.ingest_filter if override and override.ingest_filter is not None else s.ingest_filter
            if substring and substring not in message:
                return False
            if s.ingest_regex:
                try:
                    if not re.search(s.ingest_regex, message):
                        return False
                except re.error:
                    pass  # invalid pattern: ignored (and reported as a finding), as LibreFang does
        if STRATEGIES[hook].agent_filtered and s.only_for_agent_ids:
            agent = str(req.get("agent_id") or "")
            return any(x in agent for x in s.only_for_agent_ids)
        return True

    # ---- what the layers' attempts add up to ----

    def on_failure(self, name: str) -> str:
        plugin = self.catalog.get(name).plugin
        return plugin.manifest.hooks.on_hook_failure if plugin is not None else "warn"

    def reason(self, attempts: list[Attempt]) -> str | None:
        """Why the answer is (partly) the default's. Failures of `skip` plugins stay silent."""
        failed = [a for a in attempts if not a.ok and self.on_failure(a.plugin) != "skip"]
        if not failed:
            return None
        return "; ".join(f"{a.plugin}: {a.failure}" for a in failed)

    def aborted(self, attempts: list[Attempt]) -> EngineReply | None:
        if not self.strategy.abortable:
            return None
        for a in attempts:
            # an unusable reply (e.g. an empty assemble list) falls back even under abort, as in LibreFang
            if not a.ok and self.on_failure(a.plugin) == "abort" and a.failure and a.failure.kind != P.INVALID_OUTPUT:
                failure = a.failure or P.Failure(P.ABORTED, "hook failed")
                return EngineReply({"type": "error"}, a.plugin, None, [x.trace_id for x in attempts if x.trace_id],
                                   aborted=True, error={"kind": P.ABORTED, "plugin": a.plugin, "hook": self.hook,
                                                        "cause": failure.kind, "message": failure.message})
        return None


def _trace_ids(attempts: list[Attempt]) -> list[str]:
    return [a.trace_id for a in attempts if a.trace_id]
