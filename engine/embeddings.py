"""Embeddings for the default engine's recall: one small port and two providers.

- `WordLlamaEmbedder`, the default: wordllama's 256-dimension static token embeddings, whose weights and tokenizer
  ship inside the PyPI wheel, so it works offline on a CPU with no configuration. It loads on first use, so a web or
  worker process that never recalls never pays its load time or memory (docs/recall.md, "Choosing the model").
- `OpenAICompatibleEmbedder`: POST {url}/embeddings (OpenAI, Ollama, vLLM, text-embeddings-inference, LiteLLM), the
  key read from the environment variable that `[embeddings] api_key_env` names.

Both raise `EmbeddingError` on any failure; recall then falls back to full text and records the reason
(plugins_app/selectors/memories.py). Vectors are unit length, so a dot product is the cosine.
"""

from __future__ import annotations

import json
import math
import os
import threading
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field


class EmbeddingError(Exception):
    """The embedder could not embed (model missing, endpoint down, wrong answer)."""


class Embedder(Protocol):
    model: str  # recorded next to every vector: vectors of two models are never compared
    dimensions: int

    def embed(self, texts: Sequence[str]) -> list[list[float]]: ...


class EmbeddingsConfig(BaseModel):
    """`[embeddings]` in config.toml."""

    model_config = ConfigDict(extra="forbid")
    provider: str = Field("wordllama", pattern="^(wordllama|openai|none)$")
    url: str | None = None  # e.g. http://127.0.0.1:11434/v1 (Ollama); /embeddings is appended
    model: str | None = None
    dimensions: int | None = Field(None, gt=0, le=8192)
    api_key_env: str | None = None  # the NAME of the environment variable holding the key
    timeout_secs: float = Field(3.0, gt=0)  # ingest waits this long at most for its query's vector


def normalized(vec: Sequence[float]) -> list[float]:
    norm = math.sqrt(sum(x * x for x in vec))
    return [x / norm for x in vec] if norm > 0 else [0.0] * len(vec)


class WordLlamaEmbedder:
    model = "wordllama-l2-supercat-256"
    dimensions = 256
    _lock = threading.Lock()
    _loaded = None

    @classmethod
    def _inference(cls):
        with cls._lock:
            if cls._loaded is None:
                try:
                    import wordllama
                    # The wheel carries weights/ and tokenizers/, but wordllama 0.4 looks for its packaged tokenizer
                    # under tokenizer/ and would download it: the package directory as the cache keeps it offline.
                    cls._loaded = wordllama.WordLlama.load(dim=cls.dimensions, disable_download=True,
                                                           cache_dir=Path(wordllama.__file__).parent)
                except Exception as exc:  # ImportError, a missing file: recall goes on with text
                    raise EmbeddingError(f"wordllama could not load: {exc}") from exc
            return cls._loaded

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if not texts:
            return []
        try:
            out = self._inference().embed(list(texts), norm=True)
        except EmbeddingError:
            raise
        except Exception as exc:
            raise EmbeddingError(f"wordllama failed: {exc}") from exc
        return [[float(x) for x in row] for row in out]


class OpenAICompatibleEmbedder:
    def __init__(self, cfg: EmbeddingsConfig):
        if not (cfg.url and cfg.model and cfg.dimensions):
            raise EmbeddingError("[embeddings] provider = \"openai\" needs url, model and dimensions")
        self.cfg = cfg
        self.model = f"openai:{cfg.model}"
        self.dimensions = cfg.dimensions
        self.endpoint = cfg.url.rstrip("/") + ("" if cfg.url.rstrip("/").endswith("/embeddings") else "/embeddings")

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if not texts:
            return []
        key = os.environ.get(self.cfg.api_key_env or "") or None
        body = {"model": self.cfg.model, "input": list(texts), "encoding_format": "float"}
        req = urllib.request.Request(self.endpoint, data=json.dumps(body).encode(), headers={
            "Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})})
        try:
            with urllib.request.urlopen(req, timeout=self.cfg.timeout_secs) as resp:  # noqa: S310 (operator's URL)
                data = json.loads(resp.read())
            rows = sorted(data["data"], key=lambda d: d.get("index", 0))
            vectors = [normalized([float(x) for x in row["embedding"]]) for row in rows]
        except (OSError, urllib.error.URLError, ValueError, KeyError, TypeError) as exc:
            raise EmbeddingError(f"{self.endpoint}: {exc}") from exc
        if len(vectors) != len(texts) or any(len(v) != self.dimensions for v in vectors):
            raise EmbeddingError(f"{self.endpoint} answered {len(vectors)} vectors of "
                                 f"{sorted({len(v) for v in vectors})} dimensions; expected {len(texts)} of "
                                 f"{self.dimensions}")
        return vectors


def embedder_for(cfg: EmbeddingsConfig) -> Embedder | None:
    """The configured embedder; None when recall is text only (`provider = "none"`)."""
    if cfg.provider == "none":
        return None
    if cfg.provider == "openai":
        return OpenAICompatibleEmbedder(cfg)
    return WordLlamaEmbedder()


def fuse(rankings: Sequence[Sequence[int]], k: int = 60) -> dict[int, float]:
    """Reciprocal rank fusion of ranked id lists, scaled to 0..1: 1 for an id ranked first in every list."""
    if not rankings:
        return {}
    best = len(rankings) / (k + 1)
    scores: dict[int, float] = {}
    for ranking in rankings:
        for rank, item in enumerate(ranking):
            scores[item] = scores.get(item, 0.0) + 1.0 / (k + 1 + rank)
    return {item: round(s / best, 4) for item, s in scores.items()}
