"""Plugin versions as bundles (engine/plugins/bundles.py, plugins_app/services/bundles.py): published by the plugin services,
named by signed jobs, unpacked verified on a worker that holds no plugins."""

from __future__ import annotations

import asyncio
import io
import json
import os
import tarfile
import threading
import uuid

import pytest
from asgiref.sync import async_to_sync

from engine.plugins import bundles as B
from engine.plugins.sources import file_hashes
from plugins_app import bus
from plugins_app.models import ActivePlugin, EngineSetting, PluginBundle
from plugins_app.services import bundles, jobs
from plugins_app.services import plugins as plugin_service
from plugins_app.services.engine import reset_engine
from tests.app.recording_fixtures import _flush_recording, _release_writer_connection  # noqa: F401

INGEST = """
import json, os, sys
sys.stdin.read()
print(json.dumps({"type": "ingest_result", "memories": [{"content": "%s " + os.path.abspath(__file__)}]}))
"""


@pytest.fixture
def pinning(monkeypatch):
    monkeypatch.setenv("LIBREFANG_PIN_BUNDLES", "1")
    bundles._forget_pins()
    yield
    bundles._forget_pins()


def _write_ingest(home, name, version):
    (home.plugin_dir(name) / "hooks" / "ingest.py").write_text(INGEST % version)


# ---- engine/plugins/bundles.py ----

def test_it_hashes_a_directory_from_the_lockfile_file_hashes_whatever_the_mtimes(tmp_path):
    pdir = tmp_path / "p"
    (pdir / "hooks").mkdir(parents=True)
    (pdir / "plugin.toml").write_text("x")
    (pdir / "hooks" / "a.py").write_text("print(1)")
    first, blob = B.pack(pdir)
    assert first == B.digest(file_hashes(pdir))
    os.utime(pdir / "plugin.toml", (1, 1))
    assert B.pack(pdir)[0] == first
    (pdir / "hooks" / "a.py").write_text("print(2)")
    assert B.pack(pdir)[0] != first


def test_it_unpacks_read_only_and_refuses_a_blob_that_does_not_match_its_hash(tmp_path):
    pdir = tmp_path / "src" / "demo"
    (pdir / "hooks").mkdir(parents=True)
    (pdir / "plugin.toml").write_text("name = 'demo'")
    (pdir / "hooks" / "ingest.py").write_text("print(1)")
    digest, blob = B.pack(pdir)
    cache = tmp_path / "cache"
    target = B.materialise(cache, digest, "demo", blob)
    assert target == cache / digest / "demo"
    assert (target / "hooks" / "ingest.py").read_text() == "print(1)"
    assert not os.stat(target / "hooks" / "ingest.py").st_mode & 0o222
    assert B.materialise(cache, digest, "demo", b"not even gzip") == target  # already there: not unpacked again

    forged = io.BytesIO()
    with tarfile.open(fileobj=forged, mode="w:gz") as tar:
        data = b"print('evil')"
        info = tarfile.TarInfo("hooks/ingest.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    other = "f" * 64
    with pytest.raises(B.BundleError):
        B.materialise(cache, other, "demo", forged.getvalue())
    assert not (cache / other).exists()
    assert [p.name for p in cache.iterdir()] == [digest]  # no half-unpacked leftovers
    with pytest.raises(B.BundleError):
        B.cached_dir(cache, "../etc", "demo")


# ---- publishing and pinning ----

@pytest.mark.django_db(transaction=True)
def test_it_publishes_on_scaffold_and_reload_and_retires_on_uninstall(home, pinning):
    name = f"b-{uuid.uuid4().hex[:6]}"
    plugin_service.scaffold_plugin(name, "", "python", ["ingest"], actor="test")
    first = ActivePlugin.objects.get(name=name).bundle_hash
    assert PluginBundle.objects.get(hash=first).manifest["name"] == name
    assert bundles.job_pins()[0][name] == first

    _write_ingest(home, name, "v2")
    plugin_service.reload_plugin(name, actor="test")
    second = ActivePlugin.objects.get(name=name).bundle_hash
    assert second != first and bundles.job_pins()[0][name] == second

    plugin_service.set_enabled(name, False, actor="test")
    assert name not in bundles.job_pins()[0]
    plugin_service.set_enabled(name, True, actor="test")
    plugin_service.set_engine_config(name, None, actor="test")
    pins, config = bundles.job_pins()
    assert pins[name] == second and name in config
    assert EngineSetting.objects.get(key=bundles.CONFIG_KEY).text == config

    plugin_service.uninstall_plugin(name, actor="test")
    assert ActivePlugin.objects.get(name=name).retired
    assert name not in bundles.job_pins()[0]


@pytest.mark.django_db(transaction=True)
def test_the_event_loop_keeps_serving_while_a_job_waits_for_its_pins(home, pinning, settings, monkeypatch):
    """A job queued on the event loop waits for the database thread to read the plugin versions without blocking
    the loop: the database thread is freed only by another coroutine of that loop, so the job names the version
    published just before only if that coroutine kept running while the job waited (a blocked loop waits out
    PINS_LOAD_TIMEOUT_SECS, then names the last version it knew)."""
    settings.LIBREFANG_REDIS_PREFIX = prefix = f"lfpins-{uuid.uuid4().hex[:8]}"
    monkeypatch.setattr(bundles, "PINS_LOAD_TIMEOUT_SECS", 30.0)  # never reached by a loop that keeps serving
    name = f"b-{uuid.uuid4().hex[:6]}"
    plugin_service.scaffold_plugin(name, "", "python", ["ingest"], actor="test")
    assert name in bundles.job_pins()[0]  # the web process's view of the versions is filled
    _write_ingest(home, name, "v2")
    plugin_service.reload_plugin(name, actor="test")  # a new version: the view must be read again
    published = ActivePlugin.objects.get(name=name).bundle_hash
    stream = bus.JobStream(consumer=f"test-{uuid.uuid4().hex[:6]}")
    stream.ensure_group()

    async def scenario() -> str:
        release = threading.Event()
        bundles._db_thread.submit(release.wait)  # the database thread is busy until another coroutine frees it

        async def another_coroutine():  # on the same loop: it runs only while the loop is not blocked
            for _tick in range(100):
                await asyncio.sleep(0)
            release.set()

        ticking = asyncio.create_task(another_coroutine())
        try:
            return await bus.enqueue("ingest", {"agent_id": "a", "message": "m"})
        finally:
            release.set()
            await ticking

    try:
        job_id = async_to_sync(scenario)()
        [job] = [j for j in stream.read(count=10, block_ms=1000) if j.id == job_id]
        assert job.signed and job.bundles == {name: published}
    finally:
        r = bus.client()
        for key in r.scan_iter(match=prefix + ":*"):
            r.delete(key)


@pytest.mark.django_db(transaction=True)
def test_it_signs_the_bundles_a_job_names(home, pinning):
    name = f"b-{uuid.uuid4().hex[:6]}"
    plugin_service.scaffold_plugin(name, "", "python", ["ingest"], actor="test")
    _, fields = bus.job_fields("hook", "ingest", {}, 30, True)
    job = bus.parse_job("1-0", fields)
    assert job.signed and job.bundles == {name: ActivePlugin.objects.get(name=name).bundle_hash}
    tampered = {**fields, "bundles": json.dumps({name: "0" * 64})}
    assert not bus.parse_job("1-0", tampered).signed
    _, plain = bus.job_fields("install_deps", "", {}, 30, True, name)
    assert "bundles" not in plain


@pytest.mark.django_db(transaction=True)
def test_a_worker_without_the_plugin_runs_exactly_the_version_the_job_names(home, pinning, settings, tmp_path):
    name = f"b-{uuid.uuid4().hex[:6]}"
    plugin_service.scaffold_plugin(name, "", "python", ["ingest"], actor="test")
    _write_ingest(home, name, "v1")
    plugin_service.reload_plugin(name, actor="test")
    plugin_service.set_engine_config(name, None, actor="test")
    old_job = bus.parse_job("1-0", bus.job_fields("hook", "ingest", {"agent_id": "a", "message": "m"}, 60, True)[1])
    _write_ingest(home, name, "v2")
    plugin_service.reload_plugin(name, actor="test")
    new_job = bus.parse_job("1-0", bus.job_fields("hook", "ingest", {"agent_id": "a", "message": "m"}, 60, True)[1])

    # another host: no plugins, no config.toml (jobs were verified above, with the web tier's bus key)
    worker_home = tmp_path / "worker-home"
    worker_home.mkdir()
    settings.LIBREFANG_HOME = worker_home
    reset_engine()
    stream = bus.JobStream(consumer=f"test-{uuid.uuid4().hex[:6]}")
    stream.ensure_group()

    def run(job) -> str:
        assert job.signed
        assert jobs.process(job, stream) == "done"
        reply = bus.Reply.from_wire(bus.open_reply(job.id, stream.r.lrange(bus.reply_key(job.id), 0, -1)[0])).data()
        return reply["memories"][0]["content"]

    new, old = run(new_job), run(old_job)
    assert new.startswith("v2 ") and old.startswith("v1 ")  # a job queued before the reload keeps its version
    assert new.split()[1].startswith(str(worker_home / "bundles"))
    assert not (worker_home / "plugins" / name).exists()


@pytest.mark.django_db
def test_it_shows_each_hosts_load_and_bundle_cache_on_the_workers_page(client):
    from django.contrib.auth.models import User

    client.force_login(User.objects.create_user("reader", "", "pw"))
    stream = bus.JobStream(consumer=f"test-worker-{uuid.uuid4().hex[:6]}")
    stream.ensure_group()
    stream.heartbeat({"pid": 434343, "host": "box-b", "processed": 1, "inflight": 0, "concurrency": 4,
                      "load": [1.5, 0.75, 0.25], "bundle_cache": {"bundles": 3, "bytes": 2048}})
    try:
        html = client.get("/workers/").content.decode()
        assert "box-b" in html and "load 1.5 0.75 0.25" in html and "3 bundles cached (2.0\xa0KB)" in html
    finally:
        stream.retire()


@pytest.mark.django_db(transaction=True)
def test_it_publishes_plugins_installed_before_bundles_existed(home, pinning, monkeypatch):
    from tests.plugin_factory import make_plugin

    make_plugin(home.plugins_dir, "legacy-one", {"ingest": "print(1)"})
    monkeypatch.setattr(bundles, "_backfilled", [])
    pins, _ = bundles.job_pins()
    assert pins["legacy-one"] == ActivePlugin.objects.get(name="legacy-one").bundle_hash


@pytest.mark.django_db(transaction=True)
def test_the_plugin_page_names_the_version_every_host_runs_and_that_disk_state_is_per_host(home, pinning, client):
    from django.contrib.auth.models import User

    client.force_login(User.objects.create_user("reader", "", "pw"))
    name = f"b-{uuid.uuid4().hex[:6]}"
    plugin_service.scaffold_plugin(name, "", "python", ["ingest"], actor="test")
    digest = ActivePlugin.objects.get(name=name).bundle_hash
    html = client.get(f"/plugins/{name}/").content.decode()
    assert f'data-bundle="{digest}"' in html and digest[:12] in html and "are per host" in html
