"""The dashboard never hides a weaker sandbox: every page carries a banner when hooks run without namespaces."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from engine.process import sandbox

pytestmark = pytest.mark.django_db


@pytest.fixture
def fresh_probe(monkeypatch):
    """The probe runs once per process; each test probes again under its own environment."""
    monkeypatch.setattr(sandbox, "_probed", [])
    yield
    sandbox._probed.clear()


@pytest.fixture
def viewer(client):
    client.force_login(User.objects.create_user("reader", "", "pw"))


def test_it_shows_the_banner_with_the_reason_when_namespaces_are_off(client, home, viewer, fresh_probe,
                                                                    monkeypatch):
    monkeypatch.setenv("LIBREFANG_SANDBOX_NAMESPACES", "0")
    for url in ("/", "/engine/", "/doctor/"):
        page = client.get(url).content.decode()
        assert 'data-testid="sandbox-degraded"' in page, url
        assert "LIBREFANG_SANDBOX_NAMESPACES=0" in page


def test_it_shows_no_banner_when_hooks_are_contained(client, home, viewer, fresh_probe, monkeypatch):
    monkeypatch.delenv("LIBREFANG_SANDBOX_NAMESPACES", raising=False)
    if sandbox.probe()[0] is None:
        pytest.skip(f"this OS refuses hook namespaces: {sandbox.degraded_reasons()}")
    page = client.get("/").content.decode()
    assert 'data-testid="sandbox-degraded"' not in page


def test_it_shows_nothing_to_anonymous_visitors(client, home, fresh_probe, monkeypatch):
    monkeypatch.setenv("LIBREFANG_SANDBOX_NAMESPACES", "0")
    page = client.get("/login/").content.decode()
    assert "sandbox-degraded" not in page
