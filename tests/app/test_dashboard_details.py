"""Small things an operator trips over: names differing only by case, a pasted name that is too long, the create
form's hook count, and an install page that shows no error before any search."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from tests.plugin_factory import PY_ECHO_INGEST, make_plugin

pytestmark = pytest.mark.django_db


@pytest.fixture
def owner(client):
    user = User.objects.create_superuser("boss", "", "pw")
    client.force_login(user)
    return user


def test_it_refuses_a_name_that_differs_from_an_installed_one_only_by_case(client, owner, home):
    make_plugin(home.plugins_dir, "uxpy", {"ingest": PY_ECHO_INGEST})
    hint = client.get("/create/check-name/", {"name": "UxPy"}).content.decode()
    assert "A plugin named uxpy already exists" in hint
    resp = client.post("/create/", {"name": "UXPY", "runtime": "python", "hooks": ["ingest"]})
    assert resp.status_code == 400 and not (home.plugins_dir / "UXPY").exists()
    from plugins_app.services import plugins as plugin_service

    with pytest.raises(plugin_service.PluginError) as err:
        plugin_service.scaffold_plugin("UxPy", "", "python", ["ingest"], "test")
    assert err.value.status == 409 and err.value.code == "already_exists"


def test_it_says_how_long_a_pasted_name_is_instead_of_cutting_it(client, owner, home):
    page = client.get("/create/").content.decode()
    assert 'maxlength="128"' not in page  # the browser would cut a pasted name without a word
    hint = client.get("/create/check-name/", {"name": "n" * 200}).content.decode()
    assert "At most 128 characters: this one has 200." in hint


def test_it_counts_the_hooks_the_create_form_shows(client, owner, home):
    from engine.hooks import ALL_HOOKS

    page = client.get("/create/").content.decode()
    assert f"Templates for all {len(ALL_HOOKS)} hooks" in page and "seven" not in page


def test_it_shows_no_registry_error_before_a_search(client, owner, home):
    (home.root / "config.toml").write_text('[plugins]\nplugin_registries = [{name = "gone", path = '
                                           '"/nonexistent/registry"}]\n')
    first = client.get("/install/registry/").content.decode()
    assert "notice-bad" not in first and "data-registry-hint" in first
    searched = client.get("/install/registry/", {"q": ""}).content.decode()
    assert "notice-bad" in searched

