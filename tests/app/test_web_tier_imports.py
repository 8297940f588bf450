"""The web tier never runs hooks (docs/architecture.md): loading everything it serves (the ASGI application, the URL
conf with every view and API route) must not import the engine that runs them. It gets a deadline and a fallback
from engine/hook_policy.py through plugins_app/services/hook_policy.py instead."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The worker's engine: the stack of plugins, one plugin's invocation, and its builder in plugins_app.
WORKER_ONLY = ("engine.stack", "engine.invoke", "plugins_app.services.engine", "plugins_app.services.jobs")

PROBE = f"""
import json, sys
import django
django.setup()
import librefang_site.web  # what daphne serves; also loads the URL conf (librefang_site/asgi.py)
print(json.dumps(sorted(m for m in sys.modules if m in {WORKER_ONLY!r})))
"""


def test_the_web_process_loads_no_part_of_the_worker_engine(tmp_path):
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "librefang_site.settings", "LIBREFANG_HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=90)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_the_probe_would_see_the_worker_engine():
    # the same probe in the worker's shoes: importing what it loads makes the list non-empty
    code = PROBE.replace("import librefang_site.web", "import plugins_app.management.commands.worker")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "librefang_site.settings"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr
    assert set(json.loads(out.stdout.strip().splitlines()[-1])) == set(WORKER_ONLY)
