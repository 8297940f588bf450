"""Every API route denies missing, wrong, revoked and under-privileged tokens; the right role gets through."""

import pytest

from plugins_app.models import Role
from plugins_app.services.tokens import create_token, revoke_token

OWNER, ADMIN, VIEWER, AGENT = Role.OWNER, Role.ADMIN, Role.VIEWER, Role.AGENT
NOPE = "no-such-plugin"

# (method, path, required role, body). Bodies are valid, so the allowed role never gets 401/403/400-for-shape.
ROUTES = [
    ("GET", "/plugins", VIEWER, None),
    ("GET", "/plugins/doctor", VIEWER, None),
    ("GET", f"/plugins/{NOPE}", VIEWER, None),
    ("GET", f"/plugins/{NOPE}/lint", VIEWER, None),
    ("GET", f"/plugins/{NOPE}/status", VIEWER, None),
    ("GET", f"/plugins/{NOPE}/health", VIEWER, None),
    ("POST", "/plugins/scaffold", OWNER, {"name": "-bad", "runtime": "python"}),
    ("POST", "/plugins/install", OWNER, {"source": "local", "path": "/nonexistent/dir"}),
    ("POST", "/plugins/uninstall", ADMIN, {"name": NOPE}),
    ("POST", f"/plugins/{NOPE}/reload", OWNER, None),
    ("POST", f"/plugins/{NOPE}/enable", OWNER, None),
    ("POST", f"/plugins/{NOPE}/disable", ADMIN, None),
    ("POST", f"/plugins/{NOPE}/update", OWNER, {"force": False}),
    ("POST", f"/plugins/{NOPE}/install-deps", OWNER, None),
    ("POST", f"/plugins/{NOPE}/test-hook", OWNER, {"hook": "ingest", "input": {"agent_id": "a", "message": "m"}}),
    ("GET", "/context-engine/metrics", VIEWER, None),
    ("GET", "/context-engine/metrics/summary", VIEWER, None),
    ("GET", "/context-engine/metrics/prometheus", VIEWER, None),
    ("POST", "/context-engine/metrics/reset", ADMIN, {}),
    ("GET", "/context-engine/traces", VIEWER, None),
    ("GET", "/context-engine/traces/history", VIEWER, None),
    ("GET", "/context-engine/traces/0123456789abcdef", VIEWER, None),
    ("GET", "/context-engine/chain", VIEWER, None),
    ("GET", "/context-engine/config", VIEWER, None),
    ("PUT", "/context-engine/config", ADMIN, {"plugin": NOPE}),
    ("GET", "/context-engine/health", VIEWER, None),
    ("POST", "/context-engine/hooks/ingest", AGENT, {"agent_id": "a", "message": "m"}),
    ("POST", "/context-engine/hooks/assemble", AGENT, {"messages": []}),
    ("POST", "/context-engine/hooks/compact", AGENT, {"messages": []}),
    ("POST", "/context-engine/hooks/after_turn", AGENT, {"agent_id": "a", "messages": []}),
    ("POST", "/context-engine/hooks/bootstrap", AGENT, {}),
    ("POST", "/context-engine/hooks/prepare_subagent", AGENT, {"parent_id": "p", "child_id": "c"}),
    ("POST", "/context-engine/hooks/merge_subagent", AGENT, {"parent_id": "p", "child_id": "c"}),
    ("POST", "/context-engine/hooks/transform_tool_result", AGENT, {"tool_name": "t", "content": "x"}),
    ("POST", "/context-engine/hooks/on_event", AGENT, {"event": {"name": "x"}}),
]
UNDER = {
    OWNER: [AGENT, VIEWER, ADMIN],
    ADMIN: [AGENT, VIEWER],
    VIEWER: [AGENT],
    AGENT: [VIEWER],
}
IDS = [f"{m} {p}" for m, p, _, _ in ROUTES]
# Routes whose success path would block on a worker (no worker runs in app tests): only denial is checked here;
# tests/e2e covers them with a real worker.
NEEDS_WORKER = {"/context-engine/hooks/ingest", "/context-engine/hooks/assemble", "/context-engine/hooks/compact",
                "/context-engine/hooks/bootstrap", "/context-engine/hooks/prepare_subagent",
                "/context-engine/hooks/merge_subagent", "/context-engine/hooks/transform_tool_result"}


def call(client, method, path, body, token=None, prefix="/api"):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token is not None else {}
    import json

    data = json.dumps(body) if body is not None else None
    fn = getattr(client, method.lower())
    if data is None:
        return fn(prefix + path, **headers)
    return fn(prefix + path, data=data, content_type="application/json", **headers)


@pytest.fixture
def tokens(db):
    return {role: create_token(f"t-{role}", role)[1] for role in (OWNER, ADMIN, VIEWER, AGENT)}


@pytest.mark.django_db
@pytest.mark.parametrize("method,path,role,body", ROUTES, ids=IDS)
def test_it_denies_missing_wrong_and_revoked_tokens(client, home, tokens, method, path, role, body):
    r = call(client, method, path, body)
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
    r = call(client, method, path, body, token="lf_not-a-real-token")
    assert r.status_code == 401
    token_row, raw = create_token("soon-revoked", OWNER)
    revoke_token(token_row.pk)
    r = call(client, method, path, body, token=raw)
    assert r.status_code == 401, r.content
    r = call(client, method, path, body, token="")
    assert r.status_code == 401


@pytest.mark.django_db
@pytest.mark.parametrize("method,path,role,body", ROUTES, ids=IDS)
def test_it_denies_under_privileged_roles(client, home, tokens, method, path, role, body):
    for weaker in UNDER[role]:
        r = call(client, method, path, body, token=tokens[weaker])
        assert r.status_code == 403, (weaker, r.status_code, r.content)
        assert r.json()["error"]["code"] == "forbidden"


@pytest.mark.django_db
@pytest.mark.parametrize("method,path,role,body", [r for r in ROUTES if r[1] not in NEEDS_WORKER],
                         ids=[i for i, r in zip(IDS, ROUTES, strict=True) if r[1] not in NEEDS_WORKER])
def test_it_lets_the_required_role_through(client, home, tokens, method, path, role, body):
    r = call(client, method, path, body, token=tokens[role])
    assert r.status_code not in (401, 403, 500), r.content
    if role != AGENT:  # owner may do everything an admin or viewer may
        r = call(client, method, path, body, token=tokens[OWNER])
        assert r.status_code not in (401, 403, 500), r.content


@pytest.mark.django_db
@pytest.mark.parametrize("method,path,role,body", ROUTES[:6], ids=IDS[:6])
def test_it_protects_the_v1_mount_too(client, home, tokens, method, path, role, body):
    assert call(client, method, path, body, prefix="/api/v1").status_code == 401
    r = call(client, method, path, body, token=tokens[role], prefix="/api/v1")
    assert r.status_code not in (401, 403, 500)


def test_it_covers_every_documented_route_in_the_table():
    """A new plugin or context-engine route cannot be added without its denial cases here."""
    from plugins_app.api import api

    schema = api.get_openapi_schema()
    documented = {(m.upper(), p.removeprefix("/api")) for p, ops in schema["paths"].items() for m in ops
                  if p.startswith(("/api/plugins", "/api/context-engine"))}
    table = {(m, p.replace(NOPE, "{name}").replace("0123456789abcdef", "{trace_id}")) for m, p, _, _ in ROUTES}
    assert documented == table
    for path, ops in schema["paths"].items():
        if path.startswith(("/api/plugins", "/api/context-engine")):
            for op in ops.values():
                assert op["x-required-role"] in ("owner", "admin", "viewer", "agent"), path
