"""The HTTP API (django-ninja), mounted at /api/ and /api/v1/."""

from plugins_app.api.app import api

__all__ = ["api"]
