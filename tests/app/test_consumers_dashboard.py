"""Websocket consumers with channels' WebsocketCommunicator over the real Redis channel layer and live feeds."""

from __future__ import annotations

import json
import shutil
import uuid

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser, User

from plugins_app import bus, events
from plugins_app.models import HookMetric
from plugins_app.routing import websocket_urlpatterns
from plugins_app.services.tokens import create_token
from tests.own_redis import OwnRedis
from tests.plugin_factory import PY_ECHO_INGEST, make_plugin
from tests.waiting import wait_until_async

pytestmark = [pytest.mark.django_db(transaction=True)]
APP = URLRouter(websocket_urlpatterns)


async def _connect(path: str, user=None, headers=None) -> tuple[WebsocketCommunicator, bool, int | None]:
    comm = WebsocketCommunicator(APP, path, headers=headers)
    comm.scope["user"] = user if user is not None else AnonymousUser()
    connected, code = await comm.connect(timeout=5)
    return comm, connected, code


@pytest.fixture
def user(db):
    return User.objects.create_user("watcher", "", "pw")


async def test_it_closes_unauthenticated_stderr_sockets_with_4401(home):
    for path in ("/ws/stderr/", "/ws/stderr/alpha/", "/ws/stderr/alpha/?token=wrong"):
        comm, connected, code = await _connect(path)
        assert not connected and code == 4401, path
        await comm.disconnect()


async def test_it_closes_unauthenticated_metrics_sockets_with_4401(home):
    comm, connected, code = await _connect("/ws/metrics/?view=list")
    assert not connected and code == 4401
    await comm.disconnect()


async def test_it_refuses_agent_tokens_but_accepts_viewer_tokens(home):
    _t, agent = await sync_to_async(create_token)("a", "agent")
    _t, viewer = await sync_to_async(create_token)("v", "viewer")
    comm, connected, code = await _connect(f"/ws/metrics/?view=list&token={agent}")
    assert not connected and code == 4401
    await comm.disconnect()
    comm, connected, _ = await _connect(f"/ws/metrics/?view=list&token={viewer}")
    assert connected
    await comm.disconnect()


async def test_it_takes_the_token_from_a_bearer_header_too(home):
    _t, agent = await sync_to_async(create_token)("a", "agent")
    _t, viewer = await sync_to_async(create_token)("v", "viewer")
    for raw, opens in ((viewer, True), (agent, False), ("lf_unknown", False)):
        for path in ("/ws/metrics/?view=list", "/ws/stderr/"):
            comm, connected, code = await _connect(path, headers=[(b"authorization", f"Bearer {raw}".encode())])
            assert connected is opens and (opens or code == 4401), (path, raw)
            await comm.disconnect()
    comm, connected, code = await _connect("/ws/stderr/", headers=[(b"authorization", f"Basic {viewer}".encode())])
    assert not connected and code == 4401  # another scheme is no token
    await comm.disconnect()  # as every other test: a communicator left open is an application task left running


async def test_it_refuses_an_unknown_metrics_view(home, user):
    comm, connected, code = await _connect("/ws/metrics/?view=nope", user)
    assert not connected and code == 4400
    await comm.disconnect()
    comm, connected, code = await _connect("/ws/metrics/?view=plugin", user)  # plugin= missing
    assert not connected and code == 4400
    await comm.disconnect()


async def _subscribed(feed: events.LiveFeed | None = None, up: bool = True, timeout: float = 10.0) -> None:
    """Wait until `feed` (this loop's stderr feed by default) is subscribed, or with up=False no longer is."""
    feed = feed or events.stderr_feed()
    await wait_until_async(lambda: feed.subscribed, timeout, f"the live feed {feed.channel} to become subscribed={up}",
                           until=lambda subscribed: subscribed == up)


async def _changed(changes: list[dict]) -> None:
    """What the worker's invocation writer publishes after a batch, once this loop's metrics feed listens."""
    await _subscribed(events.metrics_feed())
    await sync_to_async(events.metrics_changed)(changes)


async def _publish(*lines: tuple[str, str]) -> None:
    pub = events.StderrPublisher()
    pub.start()  # what its thread runs first; write() below is what it runs per batch
    await sync_to_async(pub.write)([{"plugin": p, "hook": "ingest", "line": text, "ts": 1.0, "trace_id": "t"}
                                    for p, text in lines])


async def test_it_streams_its_plugins_live_lines_as_html_fragments(home, user):
    now = int(await sync_to_async(bus.client().get)(events._seq_key()) or 0)
    comm, connected, _ = await _connect(f"/ws/stderr/alpha/?after={now}", user)
    assert connected
    await _subscribed()
    await _publish(("beta", "not mine"), ("alpha", "<b>hello</b>"))
    html = await comm.receive_from(timeout=5)
    assert 'id="stderr-lines" hx-swap-oob="beforeend"' in html
    assert f'data-seq="{now + 2}"' in html and "&lt;b&gt;hello&lt;/b&gt;" in html and "not mine" not in html
    # the same batch again (a re-sent publish): never repeated
    tail = await sync_to_async(events.tail)("alpha", now)
    await sync_to_async(bus.client().publish)(events._live_channel(), json.dumps(tail))
    assert await comm.receive_nothing(timeout=0.5)
    await comm.disconnect()
    assert not events.stderr_feed().watchers  # the last watcher gone: the subscription is dropped
    await _subscribed(up=False)


@pytest.fixture
def own_redis(tmp_path, settings):
    """A redis-server of this test's own (it gets killed), and the app pointed at it."""
    redis = OwnRedis(tmp_path)
    redis.start()
    settings.REDIS_URL = redis.url
    yield redis
    redis.stop()


async def _kill_under(redis: OwnRedis, feed: events.LiveFeed) -> None:
    """SIGKILL `redis` and wait until `feed` has seen its connection go."""
    redis.kill()
    await _subscribed(feed, up=False)


async def test_it_catches_up_on_lines_published_while_redis_was_away(home, user, own_redis):
    comm, connected, _ = await _connect("/ws/stderr/?format=json", user)
    assert connected
    await _subscribed()
    await _publish(("alpha", "before"))
    assert json.loads(await comm.receive_from(timeout=5))["line"] == "before"
    await _kill_under(own_redis, events.stderr_feed())
    own_redis.start()  # same port and AOF directory: the tail and the seq counter survive
    await _publish(("alpha", "during 1"), ("beta", "during 2"))  # likely before the feed is back: in the tail
    await _publish(("alpha", "after"))
    got = [json.loads(await comm.receive_from(timeout=10)) for _ in range(3)]
    assert [g["line"] for g in got] == ["during 1", "during 2", "after"]  # once each, in order
    assert [g["seq"] for g in got] == sorted(g["seq"] for g in got)
    assert await comm.receive_nothing(timeout=0.5)
    await comm.disconnect()


async def test_it_starts_counting_again_when_redis_comes_back_without_its_data(home, user, own_redis):
    comm, connected, _ = await _connect("/ws/stderr/?format=json", user)
    assert connected
    await _subscribed()
    await _publish(("alpha", "one"), ("alpha", "two"), ("alpha", "three"))
    before = [json.loads(await comm.receive_from(timeout=5)) for _ in range(3)]
    assert [b["line"] for b in before] == ["one", "two", "three"]
    await _kill_under(own_redis, events.stderr_feed())
    shutil.rmtree(own_redis.dir / "appendonlydir")  # the restarted Redis has nothing: the counter starts at 1
    own_redis.start()
    await _subscribed()
    await _publish(("alpha", "again"))  # seq 1 of a new epoch: neither a repeat of the old seq 1 nor dropped
    renumbered = json.loads(await comm.receive_from(timeout=10))
    assert set(renumbered) == {"renumbered"} and renumbered["renumbered"]["epoch"] != before[0]["epoch"]
    line = json.loads(await comm.receive_from(timeout=5))
    assert (line["line"], line["seq"], line["epoch"]) == ("again", 1, renumbered["renumbered"]["epoch"])
    await comm.disconnect()

    # a viewer resuming with the old numbering (?after=3&epoch=<old>) gets the new lines too, after the notice
    comm, connected, _ = await _connect(f"/ws/stderr/?format=json&after=3&epoch={before[0]['epoch']}", user)
    assert connected
    assert "renumbered" in json.loads(await comm.receive_from(timeout=5))
    assert json.loads(await comm.receive_from(timeout=5))["line"] == "again"
    await comm.disconnect()
    # and in HTML, the notice the page's script resets its numbering on
    comm, connected, _ = await _connect(f"/ws/stderr/?after=3&epoch={before[0]['epoch']}", user)
    assert connected
    notice = await comm.receive_from(timeout=5)
    assert 'class="missed renumbered"' in notice and f'data-epoch="{line["epoch"]}"' in notice
    assert f'data-seq="1" data-epoch="{line["epoch"]}"' in await comm.receive_from(timeout=5)
    await comm.disconnect()


async def test_it_sends_json_lines_and_resumes_after_a_seq(home, user):
    pub = events.publisher()
    for i in range(3):
        pub.line("gamma", "assemble", f"line {i}", "t" * 16)
    await sync_to_async(pub.flush)()
    tail = await sync_to_async(events.tail)("gamma")
    assert [x["line"] for x in tail][-3:] == ["line 0", "line 1", "line 2"]
    first_seq = tail[-3]["seq"]
    comm, connected, _ = await _connect(f"/ws/stderr/gamma/?format=json&after={first_seq}", user)
    assert connected
    got = [json.loads(await comm.receive_from(timeout=5)) for _ in range(2)]
    assert [g["line"] for g in got] == ["line 1", "line 2"]  # only lines after the seq the client already has
    assert set(got[0]) == {"seq", "epoch", "plugin", "hook", "line", "ts"}
    assert await comm.receive_nothing(timeout=0.3)
    await comm.disconnect()


async def test_a_viewer_resuming_after_lines_no_longer_kept_is_told_which(home, user, monkeypatch):
    monkeypatch.setattr(events, "TAIL_LEN", 3)
    plugin = f"trimmed_{uuid.uuid4().hex[:8]}"
    await _publish(*((plugin, f"line {i}") for i in range(5)))  # the tail keeps lines 2-4
    kept = await sync_to_async(events.tail)(plugin)
    first = kept[0]["seq"] - 2  # line 0's seq
    assert [x["line"] for x in kept] == ["line 2", "line 3", "line 4"]

    comm, connected, _ = await _connect(f"/ws/stderr/{plugin}/?format=json&after={first}", user)
    assert connected  # it has line 0; line 1 is gone
    assert json.loads(await comm.receive_from(timeout=5)) == {"missed": {"after": first, "through": first + 1,
                                                                         "kept": 3}}
    assert [json.loads(await comm.receive_from(timeout=5))["line"] for _ in range(3)] == ["line 2", "line 3",
                                                                                         "line 4"]
    await comm.disconnect()

    comm, connected, _ = await _connect(f"/ws/stderr/{plugin}/?after={first}", user)
    assert connected
    notice = await comm.receive_from(timeout=5)
    assert 'hx-swap-oob="beforeend"' in notice and 'class="missed"' in notice
    assert f"after #{first} up to #{first + 1}" in notice
    assert "line 2" in await comm.receive_from(timeout=5)
    await comm.disconnect()

    for path in (f"/ws/stderr/{plugin}/?format=json&after={first + 1}",  # has everything up to the kept lines
                 f"/ws/stderr/{plugin}/?format=json"):  # a first look at the tail: nothing was missed
        comm, connected, _ = await _connect(path, user)
        assert connected
        assert "seq" in json.loads(await comm.receive_from(timeout=5)), path
        await comm.disconnect()


async def test_it_pushes_re_rendered_plugin_rows_on_metrics_changed(home, user):
    await sync_to_async(make_plugin)(home.plugins_dir, "delta", {"ingest": PY_ECHO_INGEST})
    comm, connected, _ = await _connect("/ws/metrics/?view=list", user)
    assert connected
    await sync_to_async(HookMetric.objects.create)(plugin="delta", hook="ingest", calls=7, successes=7)
    from django.utils import timezone

    from plugins_app.models import HookMetricBucket

    await sync_to_async(HookMetricBucket.objects.create)(
        plugin="delta", hook="ingest", minute=timezone.now().replace(second=0, microsecond=0), calls=7,
        latency_ms_total=70, histogram={"10": 7})
    await _changed([{"plugin": "delta", "hook": "ingest"}])
    html = await comm.receive_from(timeout=5)
    assert '<tr id="plugin-row-delta" hx-swap-oob="outerHTML"' in html
    assert 'data-metric="calls">7<' in html
    await comm.disconnect()


async def test_it_pushes_hook_rows_and_state_for_the_plugin_view_only(home, user):
    await sync_to_async(make_plugin)(home.plugins_dir, "eps", {"ingest": PY_ECHO_INGEST})
    comm, connected, _ = await _connect("/ws/metrics/?view=plugin&plugin=eps", user)
    assert connected
    layer = get_channel_layer()
    await _changed([{"plugin": "other", "hook": "ingest"}])
    assert await comm.receive_nothing(timeout=0.6)  # not this plugin
    await layer.group_send(events.PLUGINS_GROUP, {"type": "plugin.changed", "plugin": "eps", "what": "disabled"})
    rows = await comm.receive_from(timeout=5)
    assert '<tbody id="hook-rows" hx-swap-oob="outerHTML">' in rows
    assert 'id="trace-rows" hx-swap-oob="outerHTML"' in rows
    # the state and the toggle form come in a message of their own: a <form> parsed among table rows loses its button
    state = await comm.receive_from(timeout=5)
    assert 'id="plugin-state" hx-swap-oob="outerHTML"' in state
    assert 'id="toggle-form" hx-swap-oob="outerHTML"' in state and "<button" in state
    assert "<tr" not in state and "<form" not in rows
    await comm.disconnect()


async def test_it_pushes_engine_totals_for_the_engine_view(home, user):
    comm, connected, _ = await _connect("/ws/metrics/?view=engine", user)
    assert connected
    await sync_to_async(HookMetric.objects.create)(plugin="zeta", hook="compact", calls=4, failures=1)
    await _changed([{"plugin": "zeta", "hook": "compact"}])
    html = await comm.receive_from(timeout=5)
    assert '<tbody id="engine-hook-rows" hx-swap-oob="outerHTML">' in html
    row = html.split('id="engine-hook-compact"')[1].split("</tr>")[0]
    assert 'data-metric="calls">4<' in row and "25.0 %" in row
    await comm.disconnect()


async def test_it_coalesces_a_burst_of_changes_into_one_message(home, user, monkeypatch):
    # The product's gather window (consumers.GATHER_SECS, 30 ms) is shorter than a burst of five sends can take on
    # a loaded machine: the later changes then ride in a second, throttled message, as designed. A window the test
    # controls (generous: the sends finish long before it ends) makes "one burst" mean the same on any machine.
    from plugins_app import consumers

    monkeypatch.setattr(consumers, "GATHER_SECS", 2.0)
    await sync_to_async(make_plugin)(home.plugins_dir, "eta", {"ingest": PY_ECHO_INGEST})
    comm, connected, _ = await _connect("/ws/metrics/?view=list", user)
    assert connected
    for _ in range(5):
        await _changed([{"plugin": "eta", "hook": "ingest"}])
    html = await comm.receive_from(timeout=10)
    assert html.count('id="plugin-row-eta"') == 1
    # A marker change sent after the burst: the consumer handles its messages in order, so any re-render left over
    # from the burst would reach the socket before the marker's own message.
    await _changed([{"plugin": "marker", "hook": "ingest"}])
    html = await comm.receive_from(timeout=10)
    assert "plugin-row-eta" not in html and '<tr id="plugin-row-marker" hx-swap-oob="delete"></tr>' in html
    await comm.disconnect()


async def test_it_re_renders_every_row_when_the_metrics_feed_comes_back(home, user, own_redis):
    await sync_to_async(make_plugin)(home.plugins_dir, "iota", {"ingest": PY_ECHO_INGEST})
    await sync_to_async(make_plugin)(home.plugins_dir, "kappa", {"ingest": PY_ECHO_INGEST})
    comm, connected, _ = await _connect("/ws/metrics/?view=list", user)
    assert connected
    await _subscribed(events.metrics_feed())
    assert await comm.receive_nothing(timeout=0.5)  # the first subscription: the page is fresh
    await _kill_under(own_redis, events.metrics_feed())
    from django.utils import timezone

    from plugins_app.models import HookMetricBucket

    await sync_to_async(HookMetricBucket.objects.create)(
        plugin="kappa", hook="ingest", minute=timezone.now().replace(second=0, microsecond=0), calls=3,
        latency_ms_total=30, histogram={"10": 3})
    own_redis.start()  # a change announced while Redis was away is lost: the feed's return re-renders every row
    html = await comm.receive_from(timeout=10)
    assert '<tr id="plugin-row-iota" hx-swap-oob="outerHTML"' in html
    assert '<tr id="plugin-row-kappa" hx-swap-oob="outerHTML"' in html
    assert 'data-metric="calls">3<' in html.split('id="plugin-row-kappa"')[1].split("</tr>")[0]
    await comm.disconnect()


async def test_a_reset_of_all_metrics_reaches_the_plugin_view(home, user):
    await sync_to_async(make_plugin)(home.plugins_dir, "lambda", {"ingest": PY_ECHO_INGEST})
    comm, connected, _ = await _connect("/ws/metrics/?view=plugin&plugin=lambda", user)
    assert connected
    await _changed([{"plugin": events.EVERY_PLUGIN, "hook": "*", "reset": True}])
    assert '<tbody id="hook-rows" hx-swap-oob="outerHTML">' in await comm.receive_from(timeout=5)
    await comm.disconnect()


async def test_it_adds_and_removes_plugin_rows_when_plugins_come_and_go(home, user):
    comm, connected, _ = await _connect("/ws/metrics/?view=list", user)
    assert connected
    await sync_to_async(make_plugin)(home.plugins_dir, "theta", {"ingest": PY_ECHO_INGEST})
    layer = get_channel_layer()
    await layer.group_send(events.PLUGINS_GROUP, {"type": "plugin.changed", "plugin": "theta", "what": "scaffolded"})
    rows = await comm.receive_from(timeout=5)
    assert '<tbody hx-swap-oob="beforeend:#plugin-rows"><tr id="plugin-row-theta"' in rows
    other = await comm.receive_from(timeout=5)
    assert '<div id="plugins-empty" hx-swap-oob="outerHTML" hidden>' in other
    assert '<p id="engine-summary" class="muted" hx-swap-oob="outerHTML">' in other
    import shutil

    await sync_to_async(shutil.rmtree)(home.plugin_dir("theta"))
    await layer.group_send(events.PLUGINS_GROUP, {"type": "plugin.changed", "plugin": "theta", "what": "uninstalled"})
    html = await comm.receive_from(timeout=5)
    assert '<tr id="plugin-row-theta" hx-swap-oob="delete"></tr>' in html
    await comm.disconnect()
