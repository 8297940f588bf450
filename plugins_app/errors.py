"""PluginError: a refused plugin operation (engine/errors.py's one shape), raised by the services that change
plugins and by the selectors that read registries. Callers catch it: `code` is stable, `status` is the HTTP status
to answer with. It lives below services and selectors so both can raise it."""

from __future__ import annotations

from engine.errors import ServiceError


class PluginError(ServiceError):
    """A refused plugin operation: routes and views just call the services and selectors."""
