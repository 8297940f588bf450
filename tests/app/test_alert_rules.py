"""Alert rules edited on the Alerts page (plugins_app/views/alerts.py `alerts_configure`): written into config.toml's
[alerts] (the rest of the file kept), read back by the evaluators, refused with a clear error when invalid, and
only for admins."""

from __future__ import annotations

import tomllib

import pytest
from django.contrib.auth.models import User

from plugins_app.models import AuditEntry
from plugins_app.selectors import alerts as alert_selectors

pytestmark = pytest.mark.django_db


def login(client, *, staff: bool):
    user = User.objects.create_user("op", "", "pw", is_staff=staff)
    client.force_login(user)
    return user


def test_it_saves_rules_thresholds_and_webhooks_into_config_toml_and_keeps_the_rest(client, home):
    (home.root / "config.toml").write_text('# my notes\n[context_engine]\nplugin = "x"\n\n[alerts]\nevery_secs = 7\n')
    login(client, staff=True)
    response = client.post("/alerts/rules/", {
        "rules": ["plugin_failing", "queue_lag"], "fallback_rate": "0.35", "queue_lag": "40",
        "webhooks": "slack https://hooks.example/a\n\nntfy https://ntfy.example/topic\n"})
    assert response.status_code == 302 and response["Location"] == "/alerts/"
    text = (home.root / "config.toml").read_text()
    assert text.startswith("# my notes") and tomllib.loads(text)["context_engine"] == {"plugin": "x"}
    config = alert_selectors.config()
    assert config.error is None and config.rules == ["plugin_failing", "queue_lag"]
    assert (config.fallback_rate, config.queue_lag, config.every_secs) == (0.35, 40, 7.0)
    assert config.webhooks == [{"url": "https://hooks.example/a", "format": "slack"},
                               {"url": "https://ntfy.example/topic", "format": "ntfy"}]
    entry = AuditEntry.objects.get(action="alerts.configure")
    assert entry.ok and entry.details["webhooks"] == ["slack", "ntfy"]  # formats only: URLs may carry secrets
    page = client.get("/alerts/").content.decode()
    assert "ntfy https://ntfy.example/topic" in page and "Save rules" in page

    client.post("/alerts/rules/", {"rules": [], "fallback_rate": "0.2", "queue_lag": "100", "webhooks": ""})
    config = alert_selectors.config()
    assert config.rules == [] and config.webhooks == []  # every rule off, no webhook: both written as such


@pytest.mark.parametrize("form, problem", [
    ({"webhooks": "smoke https://x.example/"}, "the format must be one of json, slack, ntfy"),
    ({"webhooks": "json ftp://x.example/"}, "is not an http(s) URL"),
    ({"fallback_rate": "3"}, "less than or equal to 1"),
    ({"queue_lag": "0"}, "greater than or equal to 1"),
    ({"rules": ["no_such_rule"]}, "not one of the available choices"),
])
def test_it_refuses_invalid_rules_with_the_reason_and_changes_nothing(client, home, form, problem):
    login(client, staff=True)
    data = {"rules": ["plugin_failing"], "fallback_rate": "0.2", "queue_lag": "100", "webhooks": "", **form}
    response = client.post("/alerts/rules/", data)
    assert response.status_code == 400 and problem in response.content.decode()
    assert not (home.root / "config.toml").exists()


def test_it_lets_only_admins_edit_and_shows_viewers_no_form(client, home):
    login(client, staff=False)
    assert "Save rules" not in client.get("/alerts/").content.decode()
    response = client.post("/alerts/rules/", {"rules": [], "fallback_rate": "0.2", "queue_lag": "1", "webhooks": ""})
    assert response.status_code == 403 and not (home.root / "config.toml").exists()
