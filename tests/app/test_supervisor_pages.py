"""What the dashboard and /api/health make of a worker the supervisor gave up, from a real status file
(librefang_site/supervisor.py writes it; the browser test under a real `librefang start` is in
tests/e2e/test_dashboard_failure.py)."""

from __future__ import annotations

import json
import os
import time

import pytest
from django.contrib.auth.models import User

from librefang_site.supervisor import write_json_atomic
from plugins_app.models import AuditEntry

pytestmark = pytest.mark.django_db
GIVEN_UP = "given up: SIGKILL (possibly out of memory), 6 failed starts"


@pytest.fixture
def given_up_status(home):
    """A status file as the supervisor writes it, its worker given up. The pid is this test process: alive, but
    not the parent of the web process (this one), so nothing may signal it."""
    now = time.time()
    doc = {"pid": os.getpid(), "host": "box-a", "started_at": now - 100, "updated_at": now, "stopping": False,
           "start_again_signal": "SIGUSR1",
           "children": [
               {"slot": "web", "role": "web", "index": 0, "pid": 11, "state": "running", "started_at": now - 100,
                "restarts": 0, "failed_starts": 0, "last_exit": None, "last_exit_at": None, "next_restart_at": None},
               {"slot": "worker 1", "role": "worker", "index": 1, "pid": None, "state": "fatal",
                "started_at": now - 20, "restarts": 5, "failed_starts": 6,
                "last_exit": {"pid": 4242, "code": None, "signal": "SIGKILL",
                              "cause": "SIGKILL (possibly out of memory)"},
                "last_exit_at": now - 19, "next_restart_at": None}]}
    (home.root / "run").mkdir()
    write_json_atomic(home.root / "run" / "supervisor.json", doc)
    return doc


def login(client, *, staff: bool) -> User:
    user = User.objects.create_user("admin-1" if staff else "reader", "", "pw", is_staff=staff)
    client.force_login(user)
    return user


def test_it_says_on_the_workers_page_what_was_given_up_and_offers_admins_to_start_it_again(client, given_up_status):
    login(client, staff=True)
    html = client.get("/workers/").content.decode()
    assert "data-given-up" in html and f"<strong>worker 1</strong> {GIVEN_UP}" in html
    assert 'data-child="worker 1" data-state="fatal"' in html and ">given up</span>" in html
    assert "data-start-again" in html and f"kill -USR1 {os.getpid()}" in html
    assert "The supervisor gave it up (above)." in html and "Start one with" not in html


def test_it_offers_viewers_no_button_and_refuses_their_post(client, given_up_status):
    login(client, staff=False)
    html = client.get("/workers/").content.decode()
    assert GIVEN_UP in html and "data-start-again" not in html and "an admin can, here" in html
    assert client.post("/workers/start-again/").status_code == 403


def test_it_never_signals_a_supervisor_that_is_not_its_parent(client, given_up_status):
    login(client, staff=True)
    resp = client.post("/workers/start-again/", HTTP_HX_REQUEST="true")
    html = resp.content.decode()
    assert resp.status_code == 409 and "Start again failed." in html
    assert f"not started by the supervisor (pid {os.getpid()})" in html and f"kill -USR1 {os.getpid()}" in html
    assert not AuditEntry.objects.filter(action="supervisor.start_again").exists()


def test_it_says_when_there_is_no_supervisor_or_nothing_given_up(client, home, given_up_status):
    login(client, staff=True)
    status_file = home.root / "run" / "supervisor.json"
    doc = json.loads(status_file.read_text())
    doc["children"][1].update(state="backoff", failed_starts=2)
    write_json_atomic(status_file, doc)
    resp = client.post("/workers/start-again/", HTTP_HX_REQUEST="true")
    assert resp.status_code == 409 and "has given up nothing" in resp.content.decode()
    status_file.unlink()
    resp = client.post("/workers/start-again/", HTTP_HX_REQUEST="true")
    assert resp.status_code == 409 and "No `librefang start` supervisor runs this service" in resp.content.decode()
    resp = client.post("/workers/start-again/")  # without htmx: back to the page, the refusal as a message
    assert resp.status_code == 302 and resp["Location"] == "/workers/"


def test_it_makes_the_engine_page_and_health_say_so(client, given_up_status):
    login(client, staff=False)
    html = client.get("/engine/health/").content.decode()
    assert "data-given-up" in html and f"worker 1 {GIVEN_UP}" in html and "badge bad" in html
    assert "The supervisor gave it up (below)." in html
    resp = client.get("/api/health")
    body = resp.json()
    assert resp.status_code == 503 and body["status"] == "degraded"
    assert f"supervisor: worker 1 {GIVEN_UP}" in body["problems"]
    assert body["supervisor"]["children"][1]["given_up"] == GIVEN_UP
