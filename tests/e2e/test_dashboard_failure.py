"""The dashboard under failure, in real Chromium against the real service: a plugin that fails every call is shown
failing wherever it is named, pages survive Redis going away, a SIGKILLed worker is shown dead."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import uuid

import pytest

from tests.plugin_factory import PY_ECHO_INGEST, make_plugin, write_config
from tests.waiting import wait_until

pytestmark = pytest.mark.browser
WAIT_MS = 30_000
CRASHING_INGEST = """
import sys
sys.stdin.read()
print("no database for you", file=sys.stderr)
sys.exit(1)
"""
OK_AFTER_TURN = """
import json, sys
sys.stdin.read()
print(json.dumps({"type": "ok"}))
"""


def _shot(page, screenshot_dir, name: str) -> None:
    page.screenshot(path=str(screenshot_dir / f"failure-{name}.png"), full_page=True)


def test_it_shows_the_crashing_engine_plugin_failing_on_every_panel(live, logged_in_page, screenshot_dir):
    name = f"crashy-{uuid.uuid4().hex[:6]}"
    make_plugin(live.home / "plugins", name, {"ingest": CRASHING_INGEST, "after_turn": OK_AFTER_TURN})
    write_config(live.home, plugin=name)
    try:
        for i in range(6):
            status, reply = live.hook("ingest", {"agent_id": "fails", "message": f"m{i}", "peer_id": "u"})
            assert status == 200 and reply["source"] == "default" and "script_error" in reply["fallback_reason"]
            assert live.hook("after_turn", {"agent_id": "fails", "messages": [{"role": "user", "content": "x"}]})[0] == 202
        body = wait_until(  # traces are written in the background
            lambda: live.request("GET", "/api/health", auth=False)[1], 30, f"health to count {name}'s 6 failures",
            until=lambda body: (body.get("failing") or {}).get(name, {}).get("ingest", {}).get("failures", 0) >= 6)
        failing = body["failing"][name]
        assert set(failing) == {"ingest"} and failing["ingest"]["last_error_kind"] == "script_error", body
        page = logged_in_page
        page.goto(f"{live.url}/?q={name}")
        state = page.locator(f"#plugin-row-{name} td[data-label=State]")
        assert "failing ingest" in state.inner_text() and "serving agents" not in state.inner_text()
        rates = page.locator(f"#plugin-row-{name} [data-hook-rate=ingest]").inner_text()
        assert "100" in rates, rates
        _shot(page, screenshot_dir, "crashing-plugin-list")
        page.goto(f"{live.url}/?errors=1")
        assert page.locator(f"#plugin-row-{name}").count() == 1
        page.goto(f"{live.url}/plugins/{name}/")
        assert "failing ingest" in page.inner_text("#plugin-state")
        notice = page.inner_text("[data-failing-notice]")
        assert "agent calls of ingest failed" in notice and "script_error" in notice
        _shot(page, screenshot_dir, "crashing-plugin-page")
        page.click("[data-failing-notice] a")
        page.wait_for_url(f"**/traces/?plugin={name}&hook=ingest&outcome=failed")
        assert page.locator("[data-trace-id]").count() >= 6
        page.goto(f"{live.url}/engine/")
        assert "failing ingest" in page.inner_text(f"[data-layer={name}]")
        page.wait_for_selector("#engine-health [data-health-failing]", timeout=WAIT_MS)
        assert "degraded" in page.inner_text("#engine-health")
        _shot(page, screenshot_dir, "crashing-engine-page")
        page.goto(f"{live.url}/doctor/")
        doctor = page.inner_text(f"#doctor-{name}")
        assert "problems" in doctor and "failing its ingest hook" in doctor
    finally:
        write_config(live.home)


PAGES = ["/", "/engine/", "/metrics/", "/traces/", "/workers/", "/doctor/", "/tools/", "/tokens/", "/create/",
         "/install/", "/engine/mcp/", "/alerts/"]


def _login(browser, url: str, password: str, width: int = 1280, init_script: str = "", **context_args):
    """A new browser context logged in as admin, and its page."""
    context = browser.new_context(viewport={"width": width, "height": 900}, **context_args)
    if init_script:
        context.add_init_script(init_script)
    page = context.new_page()
    page.goto(url + "/login/")
    page.fill("#id_username", "admin")
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_url(url + "/")
    return context, page


@pytest.fixture
def redis_service(tmp_path):
    from tests.e2e.live import LiveService
    from tests.own_redis import OwnRedis

    redis = OwnRedis(tmp_path)
    redis.start()
    service = LiveService(tmp_path / "svc")
    service.env["REDIS_URL"] = redis.url
    try:
        service.start(workers=1)
        yield service, redis
    finally:
        service.stop()
        redis.stop()


def test_it_renders_every_page_with_a_banner_while_redis_is_down(redis_service, browser, screenshot_dir):
    service, redis = redis_service
    make_plugin(service.home / "plugins", "steady", {"after_turn": OK_AFTER_TURN})
    write_config(service.home, plugin="steady")
    context, page = _login(browser, service.url, service.password)
    try:
        page.goto(service.url + "/plugins/steady/")
        assert page.locator("[data-outage]").count() == 0
        redis.kill()
        page.wait_for_timeout(2100)  # a web process checks at most every 2 s (plugins_app/selectors/health.py)
        for path in [*PAGES, "/plugins/steady/"]:
            response = page.goto(service.url + path)
            assert response.status < 500, (path, response.status)
            banner = page.locator("[data-outage=redis]")
            assert "default engine" in banner.inner_text() and "503" in banner.inner_text(), path
        page.goto(service.url + "/engine/")
        page.wait_for_selector("#engine-health .badge.bad", timeout=WAIT_MS)
        assert "unreachable" in page.inner_text("#engine-health")
        # The worker is alive; with its heartbeat out of reach the page says it cannot tell, not "no worker".
        assert page.locator("#engine-health [data-workers-unknown]").count() == 1
        assert page.locator("[data-layer-paused]").count() == 1  # the chain's plugin is not "serving"
        _shot(page, screenshot_dir, "redis-down-engine")
        page.goto(service.url + "/plugins/steady/")
        assert page.locator('[data-state="serving"]').count() == 0
        assert page.locator('[data-state="serving-paused"]').count() == 1
        _shot(page, screenshot_dir, "redis-down-plugin")
        status, body = service.hook("after_turn", {"agent_id": "a", "messages": [{"role": "user", "content": "x"}]})
        assert status == 503 and body["error"]["code"] == "bus_unavailable"  # what the banner says agents get
    finally:
        context.close()
        redis.start()


@contextlib.contextmanager
def _supervised_page(tmp_path, browser):
    """A service under `librefang start` (tests/e2e/test_supervisor.py Supervised) and a page logged in to it; both
    gone afterwards, whatever the test left running."""
    from tests.e2e.test_supervisor import Supervised

    service = Supervised(tmp_path)
    service.start()
    context = None
    try:
        context, page = _login(browser, service.url, (service.home / "admin_password").read_text().strip())
        yield service, page
    finally:
        if context is not None:
            context.close()
        service.kill_everything()


def test_it_shows_a_sigkilled_worker_dead_before_its_heartbeat_expires(tmp_path, browser, screenshot_dir):
    """Under `librefang start` the supervisor reaps the worker and says so in supervisor.json; the dashboard and
    /api/health take that over the heartbeat, which lives on for up to 6 s."""
    import os
    import signal

    with _supervised_page(tmp_path, browser) as (service, page):
        page.goto(service.url + "/workers/")
        pid = service.worker_pid()
        page.wait_for_selector(f"tr[data-worker-pid='{pid}']", timeout=WAIT_MS)
        os.kill(pid, signal.SIGKILL)
        page.wait_for_selector("[data-dead-workers]", timeout=WAIT_MS)
        html = page.inner_text("[data-dead-workers]")
        assert f"pid {pid}" in html and "SIGKILL" in html, html
        assert page.locator(f"tr[data-worker-pid='{pid}']").count() == 0  # not listed, nor counted, as live
        status, body = service.request("GET", "/api/health", auth=False)
        dead = [w["pid"] for w in body["dead_workers"]]
        assert pid in dead and pid not in [w["pid"] for w in body["workers"]], body
        # what proves the supervisor's word was used: the dead worker's heartbeat had not expired yet
        assert any(w["pid"] == pid and w.get("heartbeat_age_secs", 99) < 6 for w in body["dead_workers"]), body
        _shot(page, screenshot_dir, "worker-sigkilled")


def test_it_shows_a_worker_the_supervisor_gave_up_and_starts_it_again_from_the_workers_page(tmp_path, browser,
                                                                                             screenshot_dir):
    """Each worker `librefang start` starts is SIGKILLed at once (as an OOM killer would): after 6 failed starts in a
    row the supervisor gives it up; the workers page, the engine page and /api/health say so with the cause, and
    the workers page's Start again brings it back."""
    import os
    import signal

    from plugins_app.selectors.supervisor import supervisor_status
    with _supervised_page(tmp_path, browser) as (service, page):
        killed: set[int] = set()

        def worker_of(doc: dict) -> dict:
            return next(c for c in doc["children"] if c["role"] == "worker")

        def killing_each_start() -> dict:
            doc = supervisor_status(service.home)
            worker = worker_of(doc)
            if worker["state"] != "fatal" and worker["pid"] and worker["pid"] not in killed:
                os.kill(worker["pid"], signal.SIGKILL)
                killed.add(worker["pid"])
            return doc

        doc = wait_until(killing_each_start, 120, "the worker given up (killed at each start)",
                         until=lambda doc: worker_of(doc)["state"] == "fatal")
        worker = worker_of(doc)
        given_up = "given up: SIGKILL (possibly out of memory), 6 failed starts"
        assert worker["failed_starts"] == 6 and worker["pid"] is None, worker
        web = next(c for c in doc["children"] if c["role"] == "web")
        assert web["state"] == "running" and web["restarts"] == 0  # the web tier served throughout

        status, body = service.request("GET", "/api/health", auth=False)
        assert status == 503 and body["status"] == "degraded", body
        assert f"supervisor: worker 1 {given_up}" in body["problems"], body["problems"]
        page.goto(service.url + "/engine/")
        page.wait_for_selector("#engine-health [data-given-up]", timeout=WAIT_MS)
        assert f"worker 1 {given_up}" in page.inner_text("#engine-health [data-given-up]")
        assert "degraded" in page.inner_text("#engine-health")
        _shot(page, screenshot_dir, "worker-given-up-engine")
        page.goto(service.url + "/workers/")
        notice = page.inner_text("[data-given-up]")
        assert f"worker 1 {given_up}" in notice and f"kill -USR1 {service.proc.pid}" in notice, notice
        assert page.inner_text('tr[data-child="worker 1"] td[data-label=State]') == "given up"
        _shot(page, screenshot_dir, "worker-given-up-workers")
        log = service.log.read_text()
        assert " CRITICAL librefang.supervisor: worker 1 (pid " in log and "given up after 6 failed starts" in log

        page.click("[data-start-again]")
        page.wait_for_selector("[data-action='start again'][data-ok=true]", timeout=WAIT_MS)
        assert page.locator("[data-given-up]").count() == 0
        page.wait_for_selector('tr[data-child="worker 1"][data-state=running]', timeout=WAIT_MS)
        wait_until(lambda: service.request("GET", "/api/health", auth=False), 60, "health ok again",
                   until=lambda answer: answer[0] == 200)
        _shot(page, screenshot_dir, "worker-started-again")
        assert "SIGUSR1: starting worker 1 again (given up after 6 failed starts: SIGKILL (possibly out of memory))" \
            in service.log.read_text()


class Receiver:
    """A local webhook receiver: every POST's path, headers and body, in order."""

    def __init__(self):
        import http.server

        self.got: list[dict] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                data = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
                outer.got.append({"path": self.path, "headers": dict(self.headers), "body": data})
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                return

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        import threading

        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_for(self, test, timeout: float = 60) -> list[dict]:
        """The calls that pass `test`, once there is one."""
        wait_until(lambda: self.got[-5:], timeout, "a webhook call that passes the test",
                   until=lambda _: any(test(m) for m in self.got))
        return [m for m in self.got if test(m)]


def evaluated_at(live, key: str) -> str | None:
    """When the web tier's alert evaluator last measured `key`: every round rewrites its AlertState row."""
    with contextlib.closing(sqlite3.connect(live.env["LIBREFANG_DB"], timeout=30)) as db:
        row = db.execute("SELECT updated_at FROM plugins_app_alertstate WHERE key = ?", (key,)).fetchone()
    return row[0] if row else None


def test_it_sends_an_alert_when_a_plugin_fails_and_a_resolved_one_after(live, logged_in_page, screenshot_dir):
    receiver = Receiver()
    name = f"alerting-{uuid.uuid4().hex[:6]}"
    pdir = make_plugin(live.home / "plugins", name, {"ingest": CRASHING_INGEST})
    key = f"plugin_failing:{name}:ingest"
    write_config(live.home, plugin=name, extra=f"""
        [alerts]
        every_secs = 1
        [[alerts.webhooks]]
        url = "{receiver.url}/json"
        format = "json"
        [[alerts.webhooks]]
        url = "{receiver.url}/slack"
        format = "slack"
        [[alerts.webhooks]]
        url = "{receiver.url}/ntfy"
        format = "ntfy"
        """)
    try:
        for i in range(4):
            assert live.hook("ingest", {"agent_id": "al", "message": f"m{i}", "peer_id": "u"})[1]["source"] == "default"
        fired = receiver.wait_for(lambda m: m["path"] == "/json" and json.loads(m["body"])["alert"] == key)
        assert json.loads(fired[0]["body"])["status"] == "firing"
        assert receiver.wait_for(lambda m: m["path"] == "/slack" and name in m["body"] and "[FIRING]" in m["body"])
        ntfy = receiver.wait_for(lambda m: m["path"] == "/ntfy" and name in m["body"])
        assert ntfy[0]["headers"]["Title"] == "LibreFang firing: plugin_failing"
        for _round in range(2):  # evaluated again and again meanwhile: still one message per webhook (deduplicated)
            last = evaluated_at(live, key)
            wait_until(lambda: evaluated_at(live, key), 30, f"{key} evaluated again",
                       until=lambda at, last=last: at != last)
        assert len([m for m in receiver.got if m["path"] == "/json" and key in m["body"]]) == 1
        status, text = live.request("GET", "/api/context-engine/metrics/prometheus")
        assert f'librefang_alert_firing{{alert="{key}",rule="plugin_failing"}} 1.0' in text, text[-2000:]
        # fixed: its calls succeed again, the failures fall under half of them, and the alert resolves
        (pdir / "hooks" / "ingest.py").write_text(PY_ECHO_INGEST)
        for i in range(6):
            assert live.hook("ingest", {"agent_id": "al", "message": f"ok{i}", "peer_id": "u"})[1]["source"] == name
        resolved = receiver.wait_for(lambda m: m["path"] == "/json" and key in m["body"]
                                     and json.loads(m["body"])["status"] == "resolved")
        assert "no longer failing" in json.loads(resolved[0]["body"])["summary"]
        page = logged_in_page
        page.goto(live.url + "/alerts/")
        assert page.locator(f"#alert-history tr[data-key='{key}'][data-event=firing]").count() == 1
        assert page.locator(f"#alert-history tr[data-key='{key}'][data-event=resolved]").count() == 1
        page.click("text=Send a test message")
        page.wait_for_selector("[data-test-sent]", timeout=WAIT_MS)
        assert "3 webhooks" in page.inner_text("[data-test-sent]")
        receiver.wait_for(lambda m: m["path"] == "/slack" and "[TEST]" in m["body"])
        _shot(page, screenshot_dir, "alerts-page")
    finally:
        write_config(live.home)
        receiver.server.shutdown()


def test_it_answers_a_page_saying_the_database_is_down_instead_of_the_500_page(tmp_path, browser, screenshot_dir):
    from tests.e2e.live import LiveService

    service = LiveService(tmp_path / "svc")
    context = None
    try:
        service.start(workers=1)
        context, page = _login(browser, service.url, service.password)
        db = service.env["LIBREFANG_DB"]
        with open(db, "r+b") as fh:  # the database file no longer is one: every query fails
            fh.write(b"not a database any more " * 512)
        for path in ("/", "/engine/", "/workers/", "/doctor/", "/alerts/"):
            response = page.goto(service.url + path)
            assert response.status == 503, (path, response.status)
            assert page.locator("[data-outage=database]").count() == 1, path
            assert "Something went wrong" not in page.content()
        _shot(page, screenshot_dir, "database-down")
        status, body = service.request("GET", "/api/health", auth=False)
        assert status == 503 and body["database"] is False, body
    finally:
        if context is not None:
            context.close()
        service.stop()
