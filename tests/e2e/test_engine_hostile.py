"""Hostile hooks through the real service: each call ends within its timeout with a classified fallback, and the
worker keeps serving the next call."""

from __future__ import annotations

from tests.plugin_factory import make_plugin, write_config

HOSTILE = {
    "endless-output": ("import sys\nsys.stdin.read()\nwhile True:\n    sys.stdout.write('x' * 65536)\n",
                       "output_overflow"),
    "never-exits": ("import time\nwhile True:\n    time.sleep(1)\n", "timeout"),
    "grandchild-pipes": ("import subprocess, sys, time\nsys.stdin.read()\nsubprocess.Popen(['sleep', '300'])\n"
                         "time.sleep(300)\n", "timeout"),
    "crashes": ("import os, sys\nsys.stdin.read()\nos.kill(os.getpid(), 11)\n", "script_error"),
    "bad-utf8": ("import sys\nsys.stdin.read()\nsys.stdout.buffer.write(b'\\xff\\xfe')\n", None),
}


def test_it_survives_hostile_hooks_and_keeps_serving(live):
    for name, (src, kind) in HOSTILE.items():
        make_plugin(live.home / "plugins", name, {"ingest": src}, toml_extra="hook_timeout_secs = 2")
        write_config(live.home, plugin=name)
        status, body = live.hook("ingest", {"agent_id": "a", "message": "m"}, timeout=60)
        assert status == 200, body
        if kind is None:  # invalid UTF-8 is not a failure: it becomes {"text": ...} with replacement characters
            assert body["source"] == name and body["memories"] == []
            continue
        assert body["source"] == "default", (name, body)
        assert body["fallback_reason"].startswith(f"{name}: {kind}"), (name, body)
    make_plugin(live.home / "plugins", "well-behaved", {"ingest": (
        "import json, sys\nreq = json.loads(sys.stdin.read())\n"
        "print(json.dumps({'memories': [{'content': 'fine ' + req['message']}]}))\n")})
    write_config(live.home, plugin="well-behaved")
    status, body = live.hook("ingest", {"agent_id": "a", "message": "after"})
    assert status == 200 and body["source"] == "well-behaved"
    assert body["memories"] == [{"content": "fine after", "scope": "hook"}]
