"""The OpenAI-compatible chat client the default engine's compaction summarises with when `[llm]` of config.toml
names an endpoint and a model (engine/ports.py `Summarizer`)."""

from __future__ import annotations

import json
import os
import urllib.request

from engine.config import LlmConfig


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
