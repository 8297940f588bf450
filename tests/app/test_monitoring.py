"""Monitoring pages through Django's test client: chart data, trace explorer and detail, workers, errors, timestamps."""

from __future__ import annotations

import datetime as dt
import time
import uuid

import pytest
from django.contrib.auth.models import User
from django.template import Context, Template

from engine.ports import TEST_CONSOLE, Invocation
from plugins_app.models import AuditEntry, JobRecord
from plugins_app.services.recording import record_now
from tests.app.recording_fixtures import _flush_recording, _release_writer_connection  # noqa: F401

pytestmark = pytest.mark.django_db


@pytest.fixture
def viewer(client):
    user = User.objects.create_user("reader", "", "pw")
    client.force_login(user)
    return user


def call(ms: float, ago_s: float = 0, *, plugin: str = "alpha", hook: str = "ingest", agent: str = "agent-1",
         ok: bool = True, kind: str | None = None, inp: str = '{"text": "hello"}', out: str = '{"ok": true}',
         stderr: str = "", job_id: str | None = None, origin: str = "agent") -> Invocation:
    return Invocation(trace_id=uuid.uuid4().hex[:16], plugin=plugin, hook=hook, agent_id=agent,
                      started_at=time.time() - ago_s, elapsed_ms=ms, ok=ok, error_kind=kind,
                      error=None if ok else f"{kind}: it broke", input_preview=inp, output_preview=out,
                      stderr_tail=stderr, job_id=job_id, origin=origin)


def test_it_refuses_anonymous_users_on_every_monitoring_page(client):
    for url in ("/metrics/", "/metrics/chart.json", "/traces/", "/workers/", "/traces/0123456789abcdef/"):
        resp = client.get(url)
        assert resp.status_code == 302 and resp["Location"].startswith("/login/"), url


def test_it_serves_chart_data_for_each_range_in_at_most_300_points(client, viewer):
    record_now([call(609), call(20, ago_s=30 * 60), call(30, ago_s=3 * 3600, ok=False, kind="timeout"),
                call(5000, origin=TEST_CONSOLE), call(40, ago_s=2 * 86400, plugin="beta")])
    for rng, expect_calls in (("15m", 1), ("1h", 2), ("24h", 3), ("7d", 4)):
        d = client.get("/metrics/chart.json", {"range": rng}).json()
        assert d["range"] == rng and d["summary"]["calls"] == expect_calls, rng
        assert len(d["t"]) <= 300 and len(d["t"]) == len(d["p95_ms"]) == len(d["calls"])
        assert d["summary"]["test_console_calls"] == 1
        assert d["end"] - d["start"] == {"15m": 900, "1h": 3600, "24h": 86400, "7d": 7 * 86400}[rng]
    one = client.get("/metrics/chart.json", {"range": "15m", "plugin": "alpha", "hook": "ingest"}).json()
    assert abs(one["summary"]["p50_ms"] - 609) / 609 <= 0.01 and one["summary"]["p99_ms"] == one["summary"]["p50_ms"]
    assert client.get("/metrics/chart.json", {"range": "7d", "plugin": "beta"}).json()["summary"]["calls"] == 1
    now = time.time()
    custom = client.get("/metrics/chart.json", {"from": str(now - 4 * 3600), "to": str(now - 2 * 3600)}).json()
    assert custom["range"] == "custom" and custom["summary"]["calls"] == 1 and custom["summary"]["errors"] == 1
    for bad in ({"range": "2y"}, {"from": "yesterday", "to": "today"}, {"from": str(now), "to": str(now - 60)},
                {"from": str(now - 40 * 86400), "to": str(now)}):
        resp = client.get("/metrics/chart.json", bad)
        assert resp.status_code == 400 and resp.json()["error"], bad


def test_it_renders_the_metrics_page_with_a_chart_per_choice(client, viewer):
    record_now([call(10)])
    html = client.get("/metrics/").content.decode()
    assert "data-chart" in html and 'data-range-btn="7d"' in html and "Context engine, all plugins" in html
    html = client.get("/metrics/", {"plugin": "alpha", "hook": "ingest"}).content.decode()
    assert "alpha · ingest" in html and "plugin=alpha&amp;hook=ingest" in html
    html = client.get("/metrics/", {"plugin": "alpha"}).content.decode()
    assert "Plugin alpha, all hooks" in html and 'Hooks with calls' in html and "hook=ingest" in html


def test_it_finds_traces_by_agent_text_outcome_and_kind_and_pages_them(client, viewer):
    JobRecord.objects.create(job_id="job-fb", hook="ingest", state="done", source="default",
                             fallback_reason="alpha: timeout: no answer in 5 s")
    record_now([
        call(12, agent="agent-7", inp='{"text": "find the needle"}'),
        call(30, agent="agent-8", ok=False, kind="timeout", job_id="job-fb", stderr="Traceback: boom"),
        call(5, agent="agent-9", origin=TEST_CONSOLE),
    ] + [call(1, agent="bulk", ago_s=i) for i in range(60)])

    def found(**params) -> str:
        return client.get("/traces/", params).content.decode()

    html = found(agent="agent-7")
    assert "1 trace" in html and "find the needle" in html and "agent-8" not in html
    assert "agent-7" in found(q="needle") and "agent-8" not in found(q="needle")
    assert "agent-8" in found(q="boom")  # stderr
    assert "agent-8" in found(q="no answer in 5 s")  # the job's fallback reason
    fb = found(outcome="fallback")
    assert "agent-8" in fb and "1 trace" in fb and "fallback" in fb
    assert "agent-8" in found(error_kind="timeout") and "agent-7" not in found(error_kind="timeout")
    assert "agent-9" in found(origin=TEST_CONSOLE) and "agent-7" not in found(origin=TEST_CONSOLE)
    page1 = found(agent="bulk")
    assert "60 traces" in page1 and "page 1 of 2" in page1 and "page=2" in page1
    assert page1.count('data-trace-id="') == 50
    assert found(agent="bulk", page="2").count('data-trace-id="') == 10
    partial = client.get("/traces/", {"agent": "agent-7"}, HTTP_HX_REQUEST="true", HTTP_HX_TARGET="trace-results")
    assert "<html" not in partial.content.decode() and "agent-7" in partial.content.decode()
    # A time range: the bulk traces are all within the last 60 s, nothing older than 15 min exists.
    old = dt.datetime.now() - dt.timedelta(days=2)
    assert "No trace matches" in found(**{"from": old.strftime("%Y-%m-%dT%H:%M"),
                                          "to": (old + dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M"),
                                          "tz": "0"})


def test_it_shows_a_trace_with_request_reply_stderr_timing_and_copy_buttons(client, viewer):
    JobRecord.objects.create(job_id="job-1", hook="ingest", state="done", source="default",
                             fallback_reason="alpha: script_error: exit 1", worker="w-1")
    inv = call(609.25, ok=False, kind="script_error", inp='{"text": "hi <b>"}', out="", stderr="line one\nline two",
               job_id="job-1")
    record_now([inv])
    html = client.get(f"/traces/{inv.trace_id}/").content.decode()
    for text in ("609 ms", "609.250 ms", "line one", "&quot;hi &lt;b&gt;&quot;", "script_error", "exit 1",
                 'data-copy="#trace-request"', 'data-copy="#trace-reply"', 'data-copy="#trace-stderr"',
                 "agent got the default engine", "w-1", " UTC"):
        assert text in html, text
    assert client.get("/traces/0123456789abcdef/").status_code == 404
    assert client.get("/traces/not-a-trace/").status_code == 404


def test_it_shows_live_workers_by_host_with_the_queue(client, viewer):
    from plugins_app import bus

    stream = bus.JobStream(consumer=f"test-worker-{uuid.uuid4().hex[:6]}")
    stream.ensure_group()
    stream.heartbeat({"pid": 424242, "host": "box-a", "processed": 17, "inflight": 2,
                      "started_at": time.time() - 3700, "concurrency": 8})
    try:
        html = client.get("/workers/").content.decode()
        assert "box-a" in html and 'data-worker-pid="424242"' in html and "1 h 1 min" in html
        assert "2 of 8 slots busy" in html and "Stream length" in html and 'data-queue="lag"' in html
        partial = client.get("/workers/", HTTP_HX_REQUEST="true").content.decode()
        assert "<html" not in partial and "424242" in partial
    finally:
        stream.retire()


def test_it_renders_a_styled_404_with_navigation(client, viewer):
    resp = client.get("/no/such/page/")
    html = resp.content.decode()
    assert resp.status_code == 404 and "Page not found" in html and 'href="/engine/"' in html
    assert "favicon.svg" in html and "data-theme-toggle" in html


def test_it_renders_the_500_page_without_any_context():
    from django.template.loader import get_template

    html = get_template("500.html").render({})
    assert "Something went wrong" in html and 'href="/doctor/"' in html


def test_it_shows_absolute_times_on_hover_and_on_stderr_lines():
    out = Template("{% load dashboard_tags %}{{ when|ago }}|{{ ts|clock }}|{{ v|ms }}").render(Context({
        "when": dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC), "ts": 1767323045.5, "v": 609.2}))
    assert 'title="2026-01-02 03:04:05 UTC"' in out and "ago</time>" in out
    assert '<time class="ts"' in out and ">03:04:05.500</time>" in out and out.endswith("|609 ms")
    from django.template.loader import render_to_string

    row = render_to_string("plugins_app/partials/stderr_line_rows.html",
                           {"lines": [{"seq": 1, "plugin": "p", "hook": "ingest", "line": "hi", "ts": 1767323045.5}]})
    assert "03:04:05.500" in row


def test_it_keeps_test_console_runs_out_of_agent_calls_in_the_api(client, viewer):
    record_now([call(10), call(10, origin=TEST_CONSOLE), call(10, ok=False, kind="timeout", origin=TEST_CONSOLE)])
    from plugins_app.selectors.metrics import metrics_by_plugin

    stats = metrics_by_plugin("alpha")["plugins"]["alpha"]["ingest"]
    assert stats["calls"] == 1 and stats["failures"] == 0
    assert stats["test_console"] == {"calls": 2, "failures": 1}
    assert AuditEntry.objects.count() == 0  # reading metrics records nothing


def test_it_filters_and_pages_the_audit_log(rf):
    from django.template.loader import render_to_string

    from plugins_app.selectors.audit import audit_log

    for i in range(60):
        AuditEntry.objects.create(actor="user:boss", action="plugin.reload", target=f"p{i}")
    AuditEntry.objects.create(actor="token:ci", action="token.revoke", target="old-ci", ok=False,
                              details={"why": "leaked"})
    request = rf.get("/tokens/")
    page1 = audit_log(request.GET)
    assert page1["count"] == 61 and len(page1["entries"]) == 50 and page1["page"].has_next()
    html = render_to_string("plugins_app/partials/audit_log.html", {"audit_log": page1, "request": request})
    assert "page 1 of 2" in html and "page=2" in html and 'title="' in html and "token.revoke" in html
    page2 = audit_log(rf.get("/tokens/", {"page": "2"}).GET)
    assert len(page2["entries"]) == 11
    assert [e.target for e in audit_log(rf.get("/tokens/", {"actor": "ci"}).GET)["entries"]] == ["old-ci"]
    assert audit_log(rf.get("/tokens/", {"result": "failed"}).GET)["count"] == 1
    assert audit_log(rf.get("/tokens/", {"q": "leaked"}).GET)["count"] == 1
    assert audit_log(rf.get("/tokens/", {"action": "plugin.reload", "since": "1h"}).GET)["count"] == 60
    filtered = audit_log(rf.get("/tokens/", {"action": "plugin.reload", "page": "2"}).GET)
    assert filtered["query_string"] == "action=plugin.reload"


@pytest.mark.django_db(transaction=True)
def test_it_records_a_test_console_run_apart_from_agent_calls(home):
    from plugins_app.models import HookMetric, HookTrace
    from plugins_app.services.engine import get_engine, invocation_sink
    from tests.plugin_factory import PY_ECHO_INGEST, make_plugin, write_config

    make_plugin(home.plugins_dir, "alpha", {"ingest": PY_ECHO_INGEST})
    write_config(home.root, plugin="alpha")
    engine = get_engine()
    body = {"agent_id": "a1", "peer_id": "u1", "message": "hi"}
    assert engine.test_hook("alpha", "ingest", body).result.ok
    assert engine.handle("ingest", body).source == "alpha"
    invocation_sink().flush()
    m = HookMetric.objects.get(plugin="alpha", hook="ingest")
    assert (m.calls, m.console_calls) == (1, 1)
    assert sorted(HookTrace.objects.values_list("origin", flat=True)) == ["agent", TEST_CONSOLE]
