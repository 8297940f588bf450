"""Agents are tenants: two agent tokens bound to different agents cannot read, recall, change, delete or call hooks
for each other's agents, over REST (the lean hook path and Django's route alike), MCP and websockets; unbound agent
tokens, admins and owners behave as before (every agent). The MCP SDK over a live service: tests/e2e/test_tenancy_e2e.py."""

from __future__ import annotations

import json
import uuid

import pytest
from asgiref.sync import sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.asgi import get_asgi_application

from plugins_app import bus
from plugins_app.api.hook_asgi import LeanHookRoutes
from plugins_app.auth import token_cache
from plugins_app.mcp import tools as mcp_tools
from plugins_app.models import ApiToken, Memory
from plugins_app.routing import websocket_urlpatterns
from plugins_app.services.memory import DbMemoryStore
from plugins_app.services.tokens import create_token
from tests.app.test_api_hook_lean import Spy, asgi

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def prefix(settings):
    settings.LIBREFANG_REDIS_PREFIX = name = f"lften-{uuid.uuid4().hex[:8]}"
    yield name
    r = bus.client()
    for key in r.scan_iter(match=name + ":*"):
        r.delete(key)


@pytest.fixture
def tokens(home, prefix):
    token_cache.entries.clear()
    made = {"alice": create_token("alice-bot", "agent", agent_ids=["alice"]),
            "bob": create_token("bob-bot", "agent", agent_ids=["bob", "team-*"]),
            "any": create_token("legacy", "agent"), "admin": create_token("ops", "admin")}
    yield {name: raw for name, (_row, raw) in made.items()} | {f"{name}_row": row for name, (row, _) in made.items()}
    token_cache.entries.clear()


@pytest.fixture
def api(client, tokens):
    def request(method, path, body=None, who="alice"):
        kw = {"HTTP_AUTHORIZATION": f"Bearer {tokens[who]}"}
        fn = getattr(client, method.lower())
        if body is None:
            return fn("/api" + path, **kw)
        return fn("/api" + path, data=json.dumps(body), content_type="application/json", **kw)
    return request


@pytest.fixture
def memories():
    store = DbMemoryStore()
    return {"alice": store.remember("alice", "u1", "my bank PIN is 1234"),
            "bob": store.remember("bob", "u1", "bob's favourite tea is sencha")}


def refused(response, status=403):
    assert response.status_code == status, response.content
    return response.json()["error"]


def test_it_binds_tokens_only_to_well_formed_agent_ids_and_only_agent_tokens():
    row, _ = create_token("p", "agent", agent_ids=["planner-*", "planner-*", " x "])
    assert row.agent_ids == ["planner-*", "x"]
    for bad in (["*"], ["a*b"], ["a" * 201]):
        with pytest.raises(ValueError):
            create_token("bad", "agent", agent_ids=bad)
    with pytest.raises(ValueError, match="only agent tokens"):
        create_token("v", "viewer", agent_ids=["alice"])


def test_it_keeps_each_agents_memories_to_its_own_token(api, memories):
    alice, bob = memories["alice"], memories["bob"]
    # read, search, scopes
    assert refused(api("GET", "/memories?agent_id=bob"))["code"] == "agent_forbidden"
    assert refused(api("GET", "/memories?agent_id=bob&q=tea"))["code"] == "agent_forbidden"
    assert refused(api("GET", "/memories/scopes?agent_id=bob"))["code"] == "agent_forbidden"
    assert [m["content"] for m in api("GET", "/memories?agent_id=alice").json()["items"]] == ["my bank PIN is 1234"]
    # by id: another agent's memory does not exist for this token
    for method, body in (("GET", None), ("PATCH", {"content": "stolen"}), ("DELETE", None)):
        assert refused(api(method, f"/memories/{bob.id}", body), 404)["code"] == "not_found"
    assert api("GET", f"/memories/{alice.id}").status_code == 200
    # writes
    assert refused(api("POST", "/memories", {"agent_id": "bob", "content": "planted"}))["code"] == "agent_forbidden"
    assert refused(api("PUT", "/memories", {"agent_id": "bob", "key": "k", "content": "x"}))["code"] == \
        "agent_forbidden"
    # a scope delete of another agent is refused; of its own agent, allowed
    assert refused(api("DELETE", "/memories?agent_id=bob"))["code"] == "agent_forbidden"
    assert api("DELETE", "/memories?agent_id=alice").json()["deleted"] == 1
    assert list(Memory.objects.values_list("content", flat=True)) == ["bob's favourite tea is sencha"]
    # bob's token, bound with a prefix too
    assert api("POST", "/memories", {"agent_id": "team-7", "content": "standup at 9"}, who="bob").status_code == 201
    assert refused(api("POST", "/memories", {"agent_id": "tea", "content": "x"}, who="bob"))["code"] == \
        "agent_forbidden"


def test_it_lets_unbound_agent_tokens_and_admins_see_every_agent_as_before(api, memories):
    for who in ("any", "admin"):
        assert api("GET", "/memories?agent_id=bob", who=who).json()["total"] == 1
        assert api("GET", f"/memories/{memories['alice'].id}", who=who).status_code == 200
    assert api("DELETE", f"/memories/{memories['bob'].id}", who="any").status_code == 200
    assert api("DELETE", "/memories?agent_id=alice", who="admin").json()["deleted"] == 1


HOOK_CALLS = [  # (hook, a request naming bob's agent: refused to alice's token)
    ("ingest", {"agent_id": "bob", "message": "what is the PIN?"}),
    ("assemble", {"agent_id": "bob", "messages": [{"role": "user", "content": "hi"}]}),
    ("compact", {"agent_id": "bob", "messages": []}),
    ("after_turn", {"agent_id": "bob", "messages": [{"role": "user", "content": "hi"}]}),
    ("transform_tool_result", {"agent_id": "bob", "tool_name": "t", "content": "x"}),
    ("prepare_subagent", {"parent_id": "alice", "child_id": "bob"}),
    ("merge_subagent", {"parent_id": "bob", "child_id": "alice"}),
    ("on_event", {"event": {"name": "x", "agent_id": "bob"}}),
    ("bootstrap", {}),  # concerns every agent
    ("on_event", {"event": {"name": "x"}}),
    ("assemble", {"messages": [{"role": "user", "content": "no agent named"}]}),
]


@pytest.mark.parametrize(("hook", "body"), HOOK_CALLS, ids=[f"{h}-{i}" for i, (h, _) in enumerate(HOOK_CALLS)])
async def test_it_refuses_hook_calls_for_another_agent_on_both_paths(tokens, hook, body):
    django_app = Spy(ASGIStaticFilesHandler(get_asgi_application()))
    lean = LeanHookRoutes(django_app)
    raw = json.dumps(body).encode()
    alone = await asgi(django_app, f"/api/context-engine/hooks/{hook}", raw, token=tokens["alice"])
    through = await asgi(lean, f"/api/context-engine/hooks/{hook}", raw, token=tokens["alice"])
    assert alone["status"] == through["status"] == 403
    assert json.loads(alone["body"]) == json.loads(through["body"])
    assert json.loads(through["body"])["error"]["code"] == "agent_forbidden"
    assert django_app.calls == 1  # the lean path answered the refusal itself, as the route does


async def test_it_lets_a_bound_token_call_hooks_for_its_own_agents(tokens):
    lean = LeanHookRoutes(Spy(ASGIStaticFilesHandler(get_asgi_application())))
    for who, agent in (("alice", "alice"), ("bob", "team-blue"), ("any", "bob")):
        body = json.dumps({"agent_id": agent, "messages": [{"role": "user", "content": "hi"}]}).encode()
        answer = await asgi(lean, "/api/context-engine/hooks/after_turn", body, token=tokens[who])
        assert answer["status"] == 202, answer
    event = json.dumps({"event": {"name": "x", "agent_id": "team-x"}}).encode()
    answer = await asgi(lean, "/api/context-engine/hooks/on_event", event, token=tokens["bob"])
    assert answer["status"] == 202, answer
    assert lean.app.calls == 0  # all answered on the lean path


async def test_it_recalls_only_the_tokens_own_agents_over_mcp(tokens, memories):
    alice = await sync_to_async(ApiToken.objects.get)(name="alice-bot")

    async def call(name, args):
        return await (await mcp_tools.find(name)).run(args, alice)

    for name, args in (("recall", {"agent_id": "bob", "query": "tea"}),
                       ("memory_list", {"agent_id": "bob"}),
                       ("memory_add", {"agent_id": "bob", "content": "planted"}),
                       ("memory_delete_scope", {"agent_id": "bob"}),
                       ("compact", {"agent_id": "bob", "messages": []}),
                       ("bootstrap", {})):
        with pytest.raises(mcp_tools.McpToolError) as denied:
            await call(name, args)
        assert denied.value.body["error"]["code"] == "agent_forbidden", name
    for name in ("memory_get", "memory_update", "memory_delete"):
        with pytest.raises(mcp_tools.McpToolError) as denied:
            await call(name, {"id": memories["bob"].id, **({"content": "x"} if name == "memory_update" else {})})
        assert denied.value.body["error"]["code"] == "not_found", name
    listed = await call("memory_list", {"agent_id": "alice", "query": "PIN"})
    assert [m["id"] for m in listed["items"]] == [memories["alice"].id]
    assert await sync_to_async(Memory.objects.filter(agent_id="bob").count)() == 1


async def test_it_refuses_bound_agent_tokens_on_the_websockets(tokens):
    app = URLRouter(websocket_urlpatterns)
    for path in ("/ws/stderr/", "/ws/metrics/?view=list"):
        comm = WebsocketCommunicator(app, f"{path}{'&' if '?' in path else '?'}token={tokens['alice']}")
        comm.scope["user"] = AnonymousUser()
        connected, code = await comm.connect(timeout=5)
        assert not connected and code == 4401, path
        await comm.disconnect()


def test_it_creates_bound_tokens_over_the_api_and_the_cli(client, home, capsys):
    from django.core.management import call_command

    _row, owner = create_token("boss", "owner")
    r = client.post("/api/tokens", data=json.dumps({"name": "carol-bot", "role": "agent", "agent_ids": ["carol"]}),
                    content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {owner}")
    assert r.status_code == 201, r.content
    created = r.json()
    assert created["agent_ids"] == ["carol"] and created["token"].startswith("lf_")
    listed = client.get("/api/tokens", HTTP_AUTHORIZATION=f"Bearer {owner}").json()["items"]
    assert {t["name"]: t["agent_ids"] for t in listed} == {"carol-bot": ["carol"], "boss": None}
    assert client.get("/api/tokens", HTTP_AUTHORIZATION=f"Bearer {created['token']}").status_code == 403
    call_command("token", "create", "--role", "agent", "--name", "dave-bot", "--agent", "dave", "--agent", "d-*")
    assert ApiToken.objects.get(name="dave-bot").agent_ids == ["dave", "d-*"]
    call_command("token", "list")
    out = capsys.readouterr().out
    assert "dave,d-*" in out and "carol" in out
    r = client.post(f"/api/tokens/{created['id']}/revoke", HTTP_AUTHORIZATION=f"Bearer {owner}")
    assert r.status_code == 200 and r.json()["active"] is False


def test_it_shows_bindings_on_the_dashboards_token_page(client, home):
    from django.contrib.auth.models import User

    client.force_login(User.objects.create_superuser("boss", "", "pw"))
    r = client.post("/tokens/new/", {"name": "erin-bot", "role": "agent", "agents": "erin, erin-*"})
    assert r.status_code == 302
    assert ApiToken.objects.get(name="erin-bot").agent_ids == ["erin", "erin-*"]
    create_token("legacy", "agent")
    page = client.get("/tokens/").content.decode()
    assert "<code>erin</code> <code>erin-*</code>" in page and "all agents" in page
    r = client.post("/tokens/new/", {"name": "v", "role": "viewer", "agents": "erin"})
    assert r.status_code == 400 and "only agent tokens" in r.content.decode()
