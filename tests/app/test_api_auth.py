"""Every API route denies missing, wrong, revoked and under-privileged tokens; the right role gets through."""

import pytest

from plugins_app.models import Role
from plugins_app.services.tokens import create_token, revoke_token

OWNER, ADMIN, VIEWER, AGENT = Role.OWNER, Role.ADMIN, Role.VIEWER, Role.AGENT
NOPE = "no-such-plugin"

# (method, path, required role, body, status the required role gets). Bodies are valid, so the allowed role never
# gets 401/403/400-for-shape; the status is what that route answers for this request (most name a plugin that is not
# installed: 404), so a route that breaks cannot hide behind "anything but 401/403".
ROUTES = [
    ("GET", "/plugins", VIEWER, None, 200),
    ("GET", "/plugins/doctor", VIEWER, None, 200),
    ("GET", f"/plugins/{NOPE}", VIEWER, None, 404),
    ("GET", f"/plugins/{NOPE}/lint", VIEWER, None, 404),
    ("GET", f"/plugins/{NOPE}/status", VIEWER, None, 404),
    ("GET", f"/plugins/{NOPE}/health", VIEWER, None, 404),
    ("POST", "/plugins/scaffold", OWNER, {"name": "-bad", "runtime": "python"}, 400),
    ("POST", "/plugins/install", OWNER, {"source": "local", "path": "/nonexistent/dir"}, 400),
    ("POST", "/plugins/install-with-deps", OWNER, {"name": NOPE, "registry": "/nonexistent/registry"}, 400),
    ("POST", "/plugins/batch", OWNER, {"operation": "disable", "plugins": [NOPE]}, 200),
    ("GET", "/plugins/registry/search", VIEWER, None, 400),
    ("GET", "/plugins/registries", VIEWER, None, 200),
    ("POST", "/plugins/uninstall", ADMIN, {"name": NOPE}, 404),
    ("POST", f"/plugins/{NOPE}/reload", OWNER, None, 404),
    ("POST", f"/plugins/{NOPE}/enable", OWNER, None, 404),
    ("POST", f"/plugins/{NOPE}/disable", ADMIN, None, 404),
    ("POST", f"/plugins/{NOPE}/update", OWNER, {"force": False}, 404),
    ("POST", f"/plugins/{NOPE}/install-deps", OWNER, None, 404),
    ("POST", f"/plugins/{NOPE}/test-hook", OWNER, {"hook": "ingest", "input": {"agent_id": "a", "message": "m"}},
     404),
    ("POST", f"/plugins/{NOPE}/benchmark", OWNER, {"hook": "ingest", "runs": 1}, 404),
    ("POST", "/plugins/prewarm", OWNER, None, 200),
    ("POST", f"/plugins/{NOPE}/prewarm", OWNER, None, 404),
    ("GET", f"/plugins/{NOPE}/export", ADMIN, None, 404),
    ("GET", f"/plugins/{NOPE}/update-check", VIEWER, None, 404),
    ("GET", f"/plugins/{NOPE}/state", VIEWER, None, 404),
    ("DELETE", f"/plugins/{NOPE}/state", ADMIN, None, 404),
    ("GET", f"/plugins/{NOPE}/env", VIEWER, None, 404),
    ("PUT", f"/plugins/{NOPE}/env", OWNER, {"env": {"A": "1"}}, 404),
    ("GET", f"/plugins/{NOPE}/advanced-config", VIEWER, None, 404),
    ("PUT", f"/plugins/{NOPE}/advanced-config", OWNER, {"hook_timeout_secs": 5}, 404),
    ("GET", f"/plugins/{NOPE}/permissions", VIEWER, None, 404),
    ("POST", f"/plugins/{NOPE}/permissions/approve", OWNER, None, 404),
    ("GET", "/context-engine/metrics", VIEWER, None, 200),
    ("GET", "/context-engine/metrics/summary", VIEWER, None, 200),
    ("GET", "/context-engine/metrics/prometheus", VIEWER, None, 200),
    ("GET", "/context-engine/metrics/per-agent", VIEWER, None, 200),
    ("POST", "/context-engine/metrics/reset", ADMIN, {}, 200),
    ("GET", "/context-engine/traces", VIEWER, None, 200),
    ("GET", "/context-engine/traces/history", VIEWER, None, 200),
    ("GET", "/context-engine/traces/0123456789abcdef", VIEWER, None, 404),
    ("GET", "/context-engine/chain", VIEWER, None, 200),
    ("GET", "/context-engine/config", VIEWER, None, 200),
    ("PUT", "/context-engine/config", ADMIN, {"plugin": NOPE}, 400),
    ("GET", "/context-engine/health", VIEWER, None, 200),
    ("GET", "/context-engine/sandbox-policy", VIEWER, None, 200),
    ("POST", "/context-engine/hooks/ingest", AGENT, {"agent_id": "a", "message": "m"}, 200),
    ("POST", "/context-engine/hooks/assemble", AGENT, {"messages": []}, 200),
    ("POST", "/context-engine/hooks/compact", AGENT, {"messages": []}, 200),
    ("POST", "/context-engine/hooks/after_turn", AGENT, {"agent_id": "a", "messages": []}, 202),
    ("POST", "/context-engine/hooks/bootstrap", AGENT, {}, 200),
    ("POST", "/context-engine/hooks/prepare_subagent", AGENT, {"parent_id": "p", "child_id": "c"}, 200),
    ("POST", "/context-engine/hooks/merge_subagent", AGENT, {"parent_id": "p", "child_id": "c"}, 200),
    ("POST", "/context-engine/hooks/transform_tool_result", AGENT, {"tool_name": "t", "content": "x"}, 200),
    ("POST", "/context-engine/hooks/on_event", AGENT, {"event": {"name": "x"}}, 202),
    ("POST", "/memories", AGENT, {"agent_id": "a", "content": "remember this"}, 201),
    ("PUT", "/memories", AGENT, {"agent_id": "a", "key": "k", "content": "remember this"}, 201),
    ("GET", "/memories?agent_id=a", AGENT, None, 200),
    ("GET", "/memories/scopes?agent_id=a", AGENT, None, 200),
    ("DELETE", "/memories?agent_id=a", AGENT, None, 200),  # an agent may forget its own (scope delete)
    ("GET", "/memories/999999", AGENT, None, 404),
    ("PATCH", "/memories/999999", AGENT, {"content": "x"}, 404),
    ("DELETE", "/memories/999999", AGENT, None, 404),
    ("GET", "/tokens", OWNER, None, 200),
    ("POST", "/tokens", OWNER, {"name": "n", "role": "viewer", "agent_ids": ["a"]}, 400),
    ("POST", "/tokens/999999/revoke", OWNER, None, 404),
]
UNDER = {
    OWNER: [AGENT, VIEWER, ADMIN],
    ADMIN: [AGENT, VIEWER],
    VIEWER: [AGENT],
    AGENT: [VIEWER],
}
IDS = [f"{m} {p}" for m, p, _, _, _ in ROUTES]
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
@pytest.mark.parametrize("method,path,role,body,status", ROUTES, ids=IDS)
def test_it_denies_missing_wrong_and_revoked_tokens(client, home, tokens, method, path, role, body, status):
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
@pytest.mark.parametrize("method,path,role,body,status", ROUTES, ids=IDS)
def test_it_denies_under_privileged_roles(client, home, tokens, method, path, role, body, status):
    for weaker in UNDER[role]:
        r = call(client, method, path, body, token=tokens[weaker])
        assert r.status_code == 403, (weaker, r.status_code, r.content)
        assert r.json()["error"]["code"] == "forbidden"


@pytest.mark.django_db
@pytest.mark.parametrize("method,path,role,body,status", [r for r in ROUTES if r[1] not in NEEDS_WORKER],
                         ids=[i for i, r in zip(IDS, ROUTES, strict=True) if r[1] not in NEEDS_WORKER])
def test_it_lets_the_required_role_through(client, home, tokens, method, path, role, body, status):
    r = call(client, method, path, body, token=tokens[role])
    assert r.status_code == status, r.content
    if status >= 400:
        assert r.json()["error"]["code"] not in ("unauthorized", "forbidden", "internal_error")
    if role != AGENT:  # owner may do everything an admin or viewer may
        r = call(client, method, path, body, token=tokens[OWNER])
        assert r.status_code == status, r.content


@pytest.mark.django_db
@pytest.mark.parametrize("method,path,role,body,status", ROUTES[:6], ids=IDS[:6])
def test_it_protects_the_v1_mount_too(client, home, tokens, method, path, role, body, status):
    assert call(client, method, path, body, prefix="/api/v1").status_code == 401
    r = call(client, method, path, body, token=tokens[role], prefix="/api/v1")
    assert r.status_code == status


def test_it_covers_every_documented_route_in_the_table():
    """A new plugin or context-engine route cannot be added without its denial cases here."""
    from plugins_app.api import api

    schema = api.get_openapi_schema()
    prefixes = ("/api/plugins", "/api/context-engine", "/api/memories", "/api/tokens")
    documented = {(m.upper(), p.removeprefix("/api")) for p, ops in schema["paths"].items() for m in ops
                  if p.startswith(prefixes)}
    table = {(m, p.replace(NOPE, "{name}").replace("0123456789abcdef", "{trace_id}").replace("memories/999999", "memories/{memory_id}")
              .replace("tokens/999999", "tokens/{token_id}").split("?")[0]) for m, p, _, _, _ in ROUTES}
    assert documented == table
    for path, ops in schema["paths"].items():
        if path.startswith(prefixes):
            for op in ops.values():
                assert op["x-required-role"] in ("owner", "admin", "viewer", "agent"), path


@pytest.mark.parametrize("header,token", [
    ("Bearer lf_abc", "lf_abc"), ("bearer lf_abc", "lf_abc"), ("BEARER  lf_abc ", "lf_abc"),
    (b"Bearer lf_abc", "lf_abc"), ("Basic lf_abc", ""), ("Bearer", ""), ("Bearer ", ""), ("lf_abc", ""), ("", ""),
    (None, ""),
])
def test_it_reads_a_bearer_header_one_way(header, token):
    """One parser for the API's routes, the lean hook path, /mcp and the websockets (plugins_app/auth.py)."""
    from plugins_app.auth import bearer_token, headers_bearer

    assert bearer_token(header) == token
    if header is not None:
        raw = header if isinstance(header, bytes) else header.encode("latin-1")
        assert headers_bearer([(b"host", b"x"), (b"authorization", raw)]) == token
        assert headers_bearer({"Authorization": raw.decode("latin-1")}) == token
