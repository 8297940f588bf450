"""What the web tier needs to answer a hook call without a worker: the deadline to wait for and the default
engine's answer (engine/hook_policy.py), over the process's cached catalog and config (plugins_app/home.py). It
imports no ContextEngine, so the web process never loads the hook runtimes (subprocess, zygote, wasmtime)."""

from __future__ import annotations

import functools
import json
import os
import urllib.request

from engine.config import LlmConfig
from engine.hook_policy import HookPolicy
from plugins_app.home import catalog, config_cache
from plugins_app.services.memory import DbMemoryStore


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
    if not (cfg.base_url and cfg.model):
        return None
    return OpenAICompatibleSummarizer(cfg, os.environ.get(cfg.api_key_env or "") or None)


@functools.lru_cache(maxsize=1)
def hook_policy() -> HookPolicy:
    """The process's deadline and fallback (the worker's engine decides the same way: engine/stack.py)."""
    return HookPolicy(catalog(), config_cache(), DbMemoryStore(), summarizer_for)
