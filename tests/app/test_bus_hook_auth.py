"""The hook routes' token check (plugins_app/api/security.py CachedHookAuth): one query per token per
TOKEN_CACHE_SECS instead of one per call; a revoked token stops working once its cache entry expires."""

from __future__ import annotations

import pytest

from plugins_app.auth import token_cache
from plugins_app.models import Role
from plugins_app.services.tokens import create_token, revoke_token

pytestmark = pytest.mark.django_db
PATH = "/api/context-engine/hooks/ingest"


def post(client, raw: str):
    # an invalid body: answered 400 right after auth, so no worker is needed
    return client.post(PATH, data={"agent_id": 5}, content_type="application/json",
                       HTTP_AUTHORIZATION=f"Bearer {raw}")


@pytest.fixture(autouse=True)
def fresh_cache():
    token_cache.entries.clear()
    yield
    token_cache.entries.clear()


def test_it_looks_a_token_up_once_then_answers_from_the_cache(client, home, django_assert_num_queries):
    _row, raw = create_token("agent-1", Role.AGENT)
    assert post(client, raw).status_code == 400
    with django_assert_num_queries(0):
        assert post(client, raw).status_code == 400


def test_it_stops_a_revoked_token_once_its_entry_expires(client, home):
    row, raw = create_token("agent-2", Role.AGENT)
    assert post(client, raw).status_code == 400
    revoke_token(row.pk)
    assert post(client, raw).status_code == 400  # within TOKEN_CACHE_SECS the cached entry still serves
    for key, (_expires, token) in list(token_cache.entries.items()):
        token_cache.entries[key] = (0.0, token)  # ... until it expires
    r = post(client, raw)
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"


def test_it_still_refuses_unknown_tokens_and_weaker_roles(client, home):
    assert post(client, "lf_not-a-token").status_code == 401
    _row, raw = create_token("viewer", Role.VIEWER)
    r = post(client, raw)
    assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"
    assert post(client, raw).status_code == 403  # cached tokens are checked for their role every time
