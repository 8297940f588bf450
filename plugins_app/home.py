"""The process's view of $LIBREFANG_HOME: the directory, its plugin catalog and its config.toml, each cached once
per process. Services (writes, the engine in plugins_app/services/engine.py) and selectors (reads) share them from
here, below both layers, so a selector never imports a service and a forget() after a write reaches every reader."""

from __future__ import annotations

import functools

from django.conf import settings

from engine.config import ConfigCache
from engine.embeddings import Embedder, EmbeddingError, EmbeddingsConfig, embedder_for
from engine.home import Home
from engine.plugins.catalog import Catalog


def home() -> Home:
    return Home(settings.LIBREFANG_HOME)


@functools.lru_cache(maxsize=1)
def catalog() -> Catalog:
    """The process's plugin catalog, shared by the engine, the hook path and every read."""
    return Catalog(home())


@functools.lru_cache(maxsize=1)
def config_cache() -> ConfigCache:
    """config.toml parsed, re-read only when the file changes."""
    return ConfigCache(home().config_path)


def embedder() -> Embedder | None:
    """The configured `[embeddings]` provider (None: recall is text only), one per configuration, so the wordllama
    model loads once per process and only when something is embedded."""
    return _embedder_for(config_cache().get().embeddings.model_dump_json())


def required_embedder() -> Embedder:
    """The configured provider; EmbeddingError when recall is text only."""
    emb = embedder()
    if emb is None:
        raise EmbeddingError('no embedder configured ([embeddings] provider = "none")')
    return emb


@functools.lru_cache(maxsize=4)
def _embedder_for(cfg_json: str) -> Embedder | None:
    return embedder_for(EmbeddingsConfig.model_validate_json(cfg_json))


def forget() -> None:
    """Drop the cached catalog and configuration (tests that switch LIBREFANG_HOME)."""
    catalog.cache_clear()
    config_cache.cache_clear()
    _embedder_for.cache_clear()
