"""Prewarm (engine/prewarm.py): the zygote started ahead of time is the very one a real call of the hook uses, and
nothing is reported warmed that is not running."""

from __future__ import annotations

import json
import os

import pytest

from engine.home import Home
from engine.invoke import hook_call_for
from engine.plugins.catalog import Catalog
from engine.prewarm import warm_plugin
from engine.process import warmstart
from engine.process.runner import PROCESS
from tests.plugin_factory import make_plugin

ECHO = "import json, os, sys\nsys.stdin.read()\nprint(json.dumps({'type': 'ok', 'ppid': os.getppid()}))\n"


pytestmark = pytest.mark.usefixtures("fresh_zygotes")


@pytest.fixture
def home(tmp_path):
    root = tmp_path / "home"
    (root / "plugins").mkdir(parents=True)
    return Home(root)


def test_it_starts_the_zygote_the_next_call_is_forked_from(home):
    make_plugin(home.plugins_dir, "warmme", {"ingest": ECHO, "after_turn": ECHO}, toml_extra="allow_network = true")
    entry = Catalog(home).get("warmme")
    assert warmstart.zygote_pids() == []

    report = warm_plugin(entry, home)

    assert report["runtime"] == "python" and sorted(report["warmed"]) == ["after_turn", "ingest"]
    assert report["failed"] == {} and report["skipped"] == {} and report["zygotes"] == 1
    pids = warmstart.zygote_pids()
    assert len(pids) == 1 and os.path.exists(f"/proc/{pids[0]}")
    call = hook_call_for(entry, "ingest", {"agent_id": "a", "message": "hi"}, home)
    result = PROCESS.run(call)
    assert result.ok, result.failure
    assert warmstart.zygote_pids() == pids  # the call found the prewarmed zygote: none other was started


def test_a_plugin_with_its_own_hook_environment_warms_its_own_zygote(home):
    make_plugin(home.plugins_dir, "one", {"ingest": ECHO})
    make_plugin(home.plugins_dir, "two", {"ingest": ECHO}, top_extra='[env]\nPYTHONHASHSEED = "7"')
    catalog = Catalog(home)
    assert warm_plugin(catalog.get("one"), home)["zygotes"] == 1
    assert warm_plugin(catalog.get("two"), home)["zygotes"] == 1
    assert len(warmstart.zygote_pids()) == 2  # PYTHONHASHSEED is read at start-up: a zygote may not serve both


def test_it_says_there_is_nothing_to_warm_for_other_runtimes(home):
    make_plugin(home.plugins_dir, "shelly", {"ingest": "#!/bin/sh\ncat >/dev/null\necho '{\"type\":\"ok\"}'\n"},
                runtime="bash", ext="sh")
    report = warm_plugin(Catalog(home).get("shelly"), home)
    assert report["warmed"] == [] and report["zygotes"] == 0
    assert "nothing to warm" in report["skipped"]["ingest"]
    assert warmstart.zygote_pids() == []


def test_it_reports_why_when_warm_start_is_off(home, monkeypatch):
    make_plugin(home.plugins_dir, "cold", {"ingest": ECHO}, toml_extra="warm_start = false")
    make_plugin(home.plugins_dir, "warm", {"ingest": ECHO})
    catalog = Catalog(home)
    assert warm_plugin(catalog.get("cold"), home)["skipped"] == {"ingest": "[hooks] warm_start = false"}
    monkeypatch.setenv("LIBREFANG_WARM_START", "0")
    report = warm_plugin(catalog.get("warm"), home)
    assert report["warmed"] == [] and "LIBREFANG_WARM_START=0" in report["skipped"]["ingest"]
    assert warmstart.zygote_pids() == []


def test_it_reports_a_missing_script_as_failed_and_warms_the_rest(home):
    pdir = make_plugin(home.plugins_dir, "half", {"ingest": ECHO, "after_turn": ECHO})
    (pdir / "hooks" / "after_turn.py").unlink()
    report = warm_plugin(Catalog(home).get("half"), home)
    assert report["warmed"] == ["ingest"]
    assert report["failed"]["after_turn"].startswith("script_not_found")


def test_a_zygote_that_cannot_start_is_not_reported_warmed(home):
    make_plugin(home.plugins_dir, "unlucky", {"ingest": ECHO})
    report = warm_plugin(Catalog(home).get("unlucky"), home, ensure=lambda launcher, env: False)
    assert report["warmed"] == [] and report["zygotes"] == 0
    assert "did not start" in report["failed"]["ingest"]
    json.dumps(report)  # it travels to the web tier as JSON
