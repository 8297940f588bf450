"""Where the Hermes adapters read their settings (clients/python/librefang_client/adapters/hermes/settings.py):
arguments, then `$HERMES_HOME/librefang.json` (what `hermes memory setup` has the provider write), then the
environment; the token only from an argument or the environment. Pure Python: Hermes itself is not needed here
(tests/e2e/test_client_hermes.py runs the adapters in Hermes)."""

from __future__ import annotations

import json
import stat

import pytest
from librefang_client.adapters.hermes import settings


@pytest.fixture
def home(tmp_path, monkeypatch):
    for name in ("LIBREFANG_URL", "LIBREFANG_TOKEN", "LIBREFANG_AGENT_ID", "LIBREFANG_PEER_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HERMES_HOME", str(tmp_path))
    return tmp_path


def test_arguments_win_over_the_file_which_wins_over_the_environment(home, monkeypatch):
    monkeypatch.setenv("LIBREFANG_URL", "http://env:1")
    monkeypatch.setenv("LIBREFANG_TOKEN", "env-token")
    monkeypatch.setenv("LIBREFANG_AGENT_ID", "env-agent")
    assert settings.load() == settings.Settings(url="http://env:1", token="env-token", agent_id="env-agent")

    (home / "librefang.json").write_text(json.dumps({"agent_id": "file-agent", "peer_id": "alex", "token": "leak",
                                                     "recall_limit": 3, "threshold_percent": 0.5}))
    loaded = settings.load()
    assert (loaded.url, loaded.token, loaded.agent_id, loaded.peer_id) == ("http://env:1", "env-token", "file-agent",
                                                                           "alex")
    assert (loaded.recall_limit, loaded.threshold_percent) == (3, 0.5)  # and the file's token is never read

    assert settings.load(agent_id="arg-agent", token="arg-token", peer_id=None).agent_id == "arg-agent"
    assert settings.load(token="arg-token").token == "arg-token"


def test_a_broken_file_is_an_error_that_names_it(home):
    (home / "librefang.json").write_text("{not json")
    with pytest.raises(ValueError, match="librefang.json is not a readable JSON object"):
        settings.load()
    (home / "librefang.json").write_text(json.dumps({"recall_limit": "many"}))
    with pytest.raises(ValueError, match="recall_limit must be a number, not 'many'"):
        settings.load()


def test_save_merges_the_setup_answers_without_secrets_and_only_for_the_owner(home):
    (home / "librefang.json").write_text(json.dumps({"agent_id": "old", "recall_limit": 7}))
    path = settings.save({"agent_id": "chef-bot", "url": "http://svc:4545", "token": "secret"}, home)
    assert json.loads(path.read_text()) == {"agent_id": "chef-bot", "recall_limit": 7, "url": "http://svc:4545"}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert settings.load().agent_id == "chef-bot"
