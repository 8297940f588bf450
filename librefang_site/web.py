"""What daphne serves (`librefang web`, `librefang start`): librefang_site/asgi.py's application, and what only a
serving web process does beside it. Importing the application alone (in-process tests, tools) starts none of it:
a thread of its own that wrote to the database beside a test's would fail the test's statements on SQLite."""

import gc

from librefang_site.asgi import application
from plugins_app.services import alerts

__all__ = ["application"]

alerts.start_in_background()  # the web tier evaluates and sends alerts (plugins_app/services/alerts.py says why)

# What start-up loaded (Django, the URL conf and its views) lives as long as the process: kept out of the cyclic
# collector, so that a full collection walks only what was made since, not every object start-up made while it
# holds the GIL and every call in flight waits.
gc.collect()
gc.freeze()
