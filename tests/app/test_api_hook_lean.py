"""The hook routes' lean ASGI path (plugins_app/api/hook_asgi.py) answers exactly as the django-ninja route it stands
in front of (plugins_app/api/context_engine.py): each request goes through both, and status, headers and body must
be equal. A call Django would hand to the route as it is, refused or not, is answered on the lean path (parsed once
there); any other request reaches Django (parsed once there). The web tier's deadline and fallback
(engine/hook_policy.py) follow the engine's own rules (engine/stack.py)."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from asgiref.sync import sync_to_async
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.asgi import get_asgi_application

from engine import hooks as H
from engine.hook_policy import HookPolicy
from engine.ports import NullMemory
from plugins_app.api.hook_asgi import LeanHookRoutes
from plugins_app.auth import token_cache
from plugins_app.models import Role
from plugins_app.services import hooks as hook_service
from plugins_app.services.engine import catalog, config_cache, get_engine, hook_policy
from plugins_app.services.tokens import create_token, revoke_token
from tests.plugin_factory import make_plugin, write_config

pytestmark = pytest.mark.django_db(transaction=True)
PATH = "/api/context-engine/hooks/"
VALID = {
    H.INGEST: {"agent_id": "a", "message": "m"},
    H.ASSEMBLE: {"messages": [{"role": "user", "content": "hi"}]},
    H.COMPACT: {"messages": []},
    H.AFTER_TURN: {"agent_id": "a", "messages": []},
    H.BOOTSTRAP: {},
    H.PREPARE_SUBAGENT: {"parent_id": "p", "child_id": "c"},
    H.MERGE_SUBAGENT: {"parent_id": "p", "child_id": "c"},
    H.TRANSFORM_TOOL_RESULT: {"tool_name": "t", "content": "x"},
    H.ON_EVENT: {"event": {"name": "x"}},
}


class Spy:
    """An ASGI app that counts the requests it is given and passes them on."""

    def __init__(self, app):
        self.app = app
        self.calls = 0

    async def __call__(self, scope, receive, send):
        self.calls += 1
        return await self.app(scope, receive, send)


@pytest.fixture
def apps(home):
    token_cache.entries.clear()
    django_app = Spy(ASGIStaticFilesHandler(get_asgi_application()))
    yield django_app, LeanHookRoutes(django_app)
    token_cache.entries.clear()


@pytest.fixture
def tokens(apps):
    return {role: create_token(f"lean-{role}", role)[1] for role in (Role.OWNER, Role.ADMIN, Role.VIEWER, Role.AGENT)}


@pytest.fixture
def canned(monkeypatch):
    """call_hook answers what the test says (no worker, no Redis) and counts its calls."""
    state = {"answer": (200, {}, {}), "calls": []}

    async def fake(hook, request):
        state["calls"].append((hook, request))
        answer = state["answer"]
        if isinstance(answer, Exception):
            raise answer
        status, body, headers = answer
        return hook_service.Answer.of(body, status, headers)

    monkeypatch.setattr(hook_service, "call_hook", fake)
    return state


async def asgi(app, path: str, body: bytes | list[bytes] = b"", *, method: str = "POST", token: str | None = None,
               headers: list[tuple[bytes, bytes]] | None = None, host: bytes = b"testserver",
               disconnect_when: asyncio.Event | None = None) -> dict:
    """One request through `app`: status, headers (sorted, names lower-cased) and body."""
    chunks = body if isinstance(body, list) else [body]
    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
    head = [(b"host", host), (b"content-type", b"application/json"), *(headers or [])]
    if token is not None:
        head.append((b"authorization", f"Bearer {token}".encode()))
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "", "headers": head,
             "client": ("127.0.0.1", 50000), "server": ("testserver", 80)}
    sent: list[dict] = []

    async def receive():
        if messages:
            return messages.pop(0)
        if disconnect_when is not None:
            await disconnect_when.wait()
            return {"type": "http.disconnect"}
        await asyncio.Event().wait()  # nothing more from this client

    async def send(message):
        sent.append(message)

    await asyncio.wait_for(app(scope, receive, send), 20)
    if not sent:
        return {"status": None, "headers": [], "body": b""}
    start = sent[0]
    return {"status": start["status"],
            "headers": sorted((k.decode().lower(), v.decode()) for k, v in start["headers"]),
            "body": b"".join(m.get("body", b"") for m in sent[1:])}


async def both(apps, *args, **kwargs) -> tuple[dict, dict, int]:
    """The same request through Django alone and through the lean path; how many of them the lean path passed on."""
    django_app, lean = apps
    plain = await asgi(django_app, *args, **kwargs)
    before = django_app.calls
    answered = await asgi(lean, *args, **kwargs)
    return plain, answered, django_app.calls - before


# ---- successful calls: answered by the lean path, exactly as the route answers them ----

ANSWERS = [
    (200, {"type": "ingest_result", "memories": [{"content": "café ☕"}], "source": "default"}, {}),
    (200, {"type": "ingest_result", "memories": [], "source": "default", "fallback_reason": "deadline_exceeded: x",
           "elapsed_ms": 1.5}, {}),
    (502, {"error": {"code": "hook_aborted", "message": "p failed", "details": {"trace_ids": []}}}, {}),
    (202, {"accepted": True, "job_id": "1-0", "hook": "after_turn"}, {}),
    (503, {"error": {"code": "bus_unavailable", "message": "unreachable",
                     "details": {"cause": "x", "retry_after_secs": 2}}}, {"Retry-After": "2"}),
]


@pytest.mark.parametrize("answer", ANSWERS, ids=[f"{a[0]}-{i}" for i, a in enumerate(ANSWERS)])
async def test_it_answers_a_valid_call_itself_exactly_as_the_route_does(apps, tokens, canned, answer):
    canned["answer"] = answer
    body = json.dumps(VALID[H.INGEST]).encode()
    plain, answered, passed_on = await both(apps, PATH + "ingest", body, token=tokens[Role.AGENT])
    assert passed_on == 0
    assert answered == plain
    assert answered["status"] == answer[0] and json.loads(answered["body"]) == answer[1]
    assert dict(answered["headers"])["content-length"] == str(len(answered["body"]))
    assert canned["calls"] == [("ingest", VALID[H.INGEST])] * 2  # the agent's own dict, once per path


async def test_both_paths_convert_another_dialect_alike(apps, tokens, canned):
    """An OpenAI Chat history: the worker is sent LibreFang's format and the agent gets OpenAI's back, on both paths."""
    history = [{"role": "developer", "content": "be brief"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "c1", "type": "function", "function": {"name": "t", "arguments": '{"q": 1}'}}]},
               {"role": "tool", "tool_call_id": "c1", "content": "done"}]
    plugin_view = [{"role": "system", "content": "be brief"},
                   {"role": "assistant", "content": [{"type": "tool_use", "id": "c1", "name": "t", "input": {"q": 1}}]},
                   {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "tool_name": "t",
                                                 "content": "done", "is_error": False}]}]
    canned["answer"] = (200, {"type": "assemble_result", "messages": plugin_view[1:], "source": "p"}, {})
    body = json.dumps({"agent_id": "a", "messages": history}).encode()
    plain, answered, passed_on = await both(apps, PATH + "assemble", body, token=tokens[Role.AGENT])
    assert passed_on == 0 and answered == plain
    assert json.loads(answered["body"]) == {"type": "assemble_result", "messages": history[1:], "source": "p",
                                            "dialect": "openai"}
    assert canned["calls"] == [("assemble", {"agent_id": "a", "messages": plugin_view})] * 2


async def test_an_unexpected_error_is_the_routes_500_envelope(apps, tokens, canned):
    canned["answer"] = RuntimeError("boom")
    plain, answered, passed_on = await both(apps, PATH + "ingest", json.dumps(VALID[H.INGEST]).encode(),
                                            token=tokens[Role.AGENT])
    assert passed_on == 0 and answered == plain and answered["status"] == 500
    assert json.loads(answered["body"])["error"]["code"] == "internal_error"


@pytest.mark.parametrize("hook", H.ALL_HOOKS)
@pytest.mark.parametrize("prefix", ["/api", "/api/v1"])
async def test_every_hook_and_both_mounts_are_answered_lean_for_agent_admin_and_owner(apps, tokens, canned, hook,
                                                                                      prefix):
    canned["answer"] = (200, {"type": "ok", "source": "default"}, {})
    for role in (Role.AGENT, Role.ADMIN, Role.OWNER):
        plain, answered, passed_on = await both(apps, f"{prefix}/context-engine/hooks/{hook}",
                                                json.dumps(VALID[hook]).encode(), token=tokens[role])
        assert (passed_on, answered) == (0, plain), role


async def test_browser_headers_change_nothing_and_cookies_go_to_django(apps, tokens, canned):
    """An Origin, HTMX or proxy headers: Django's middleware adds nothing for them. Cookies: the CSRF middleware may
    answer with a new csrftoken cookie, so such calls are Django's."""
    canned["answer"] = (200, {"type": "ok", "source": "default"}, {})
    body = json.dumps(VALID[H.INGEST]).encode()
    extra = [(b"origin", b"http://evil.example"), (b"hx-request", b"true"), (b"x-forwarded-for", b"10.0.0.1"),
             (b"accept-encoding", b"gzip"), (b"x-forwarded-proto", b"https")]
    plain, answered, passed_on = await both(apps, PATH + "ingest", body, token=tokens[Role.AGENT], headers=extra)
    assert (passed_on, answered) == (0, plain) and plain["status"] == 200
    for cookie in (b"sessionid=abc; csrftoken=x", b"csrftoken=" + b"a" * 32):
        plain, answered, passed_on = await both(apps, PATH + "ingest", body, token=tokens[Role.AGENT],
                                                headers=[(b"cookie", cookie)])
        assert passed_on == 1 and answered["status"] == plain["status"] == 200
        assert [name for name, _ in answered["headers"]] == [name for name, _ in plain["headers"]]  # new tokens


async def test_a_body_sent_in_chunks_is_read_whole(apps, tokens, canned):
    body = json.dumps(VALID[H.INGEST]).encode()
    plain, answered, passed_on = await both(apps, PATH + "ingest", [body[:5], body[5:9], body[9:]],
                                            token=tokens[Role.AGENT])
    assert passed_on == 0 and answered == plain and plain["status"] == 200
    assert canned["calls"][-1] == ("ingest", VALID[H.INGEST])


# ---- refused calls: answered as the route answers them, on the lean path when Django would hand them to the route
# as they are, by Django otherwise ----

def refused_cases(tokens):
    """{case: (request, whether the lean path answers it)}."""
    agent, viewer = tokens[Role.AGENT], tokens[Role.VIEWER]
    ingest = json.dumps(VALID[H.INGEST]).encode()
    return {
        "no token": (dict(path=PATH + "ingest", body=ingest), True),
        "unknown token": (dict(path=PATH + "ingest", body=ingest, token="lf_not-a-token"), True),
        "empty bearer": (dict(path=PATH + "ingest", body=ingest, token=""), True),
        "basic scheme": (dict(path=PATH + "ingest", body=ingest, headers=[(b"authorization", b"Basic eDp5")]), True),
        "viewer token (403)": (dict(path=PATH + "ingest", body=ingest, token=viewer), True),
        "viewer token, v1 (403)": (dict(path="/api/v1/context-engine/hooks/ingest", body=ingest, token=viewer),
                                   True),
        "invalid json": (dict(path=PATH + "ingest", body=b"{nope", token=agent), True),
        "empty body": (dict(path=PATH + "ingest", body=b"", token=agent), True),
        "not an object": (dict(path=PATH + "ingest", body=b"[1, 2]", token=agent), True),
        "nested too deep": (dict(path=PATH + "ingest", body=b"[" * 100_000 + b"]" * 100_000, token=agent), True),
        "not utf-8": (dict(path=PATH + "ingest", body=b'{"agent_id": "\xff"}', token=agent), True),
        "wrong shape": (dict(path=PATH + "ingest", body=b'{"agent_id": 5}', token=agent), True),
        "wrong shape after_turn": (dict(path=PATH + "after_turn", body=b'{"agent_id": "a", "messages": 3}',
                                        token=agent), True),
        "unknown hook (404)": (dict(path=PATH + "nope", body=ingest, token=agent), False),
        "trailing slash": (dict(path=PATH + "ingest/", body=ingest, token=agent), False),
        "GET (405)": (dict(path=PATH + "ingest", method="GET", token=agent), False),
        "PUT (405)": (dict(path=PATH + "ingest", body=ingest, method="PUT", token=agent), False),
        "host not allowed (400)": (dict(path=PATH + "ingest", body=ingest, token=agent, host=b"evil.example"), False),
        "two authorization headers": (dict(path=PATH + "ingest", body=ingest, token=agent,
                                           headers=[(b"authorization", b"Bearer lf_other")]), False),
        "content-length not a number": (dict(path=PATH + "ingest", body=ingest, token=agent,
                                             headers=[(b"content-length", b"12x")]), False),
    }


CASES = list(refused_cases({r: "" for r in Role}).keys())


@pytest.mark.parametrize("case", CASES)
async def test_refused_calls_get_the_routes_answer_parsed_on_one_path(apps, tokens, canned, case):
    kwargs, lean = refused_cases(tokens)[case]
    plain, answered, passed_on = await both(apps, **kwargs)
    assert passed_on == (0 if lean else 1)
    assert answered == plain
    assert plain["status"] in (400, 401, 403, 404, 405, 500) or (case == "trailing slash" and plain["status"])
    assert canned["calls"] == []  # no hook was called for any of them


async def test_a_refusal_answered_on_the_lean_path_is_logged_as_django_logs_it(apps, tokens, canned, caplog):
    """Django logs every answer of 400 and above ("Unauthorized: /path"); the lean path's refusals are logged alike."""
    body = json.dumps(VALID[H.INGEST]).encode()
    django_app, lean = apps
    for app in (django_app, lean):
        caplog.clear()
        with caplog.at_level("WARNING", logger="django.request"):
            r = await asgi(app, PATH + "ingest", body, token=tokens[Role.VIEWER])
        assert r["status"] == 403
        assert [(rec.levelname, rec.getMessage()) for rec in caplog.records if rec.name == "django.request"] == [
            ("WARNING", "Forbidden: /api/context-engine/hooks/ingest")]


async def test_a_body_over_the_limit_gets_the_routes_413(apps, tokens, canned, settings):
    settings.LIBREFANG_MAX_BODY_BYTES = settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    big = json.dumps({"agent_id": "a", "message": "x" * 2000}).encode()
    for chunks in ([big], [big[:600], big[600:1300], big[1300:]]):  # one message; more than the limit in pieces
        plain, answered, passed_on = await both(apps, PATH + "ingest", chunks, token=tokens[Role.AGENT])
        assert passed_on == 1 and answered == plain and plain["status"] == 413
        assert json.loads(plain["body"])["error"]["code"] == "payload_too_large"
    assert canned["calls"] == []


async def test_a_revoked_token_is_refused_once_its_cache_entry_expires(apps, tokens, canned):
    row, raw = await sync_to_async(create_token)("lean-soon-revoked", Role.AGENT)
    body = json.dumps(VALID[H.INGEST]).encode()
    _plain, answered, passed_on = await both(apps, PATH + "ingest", body, token=raw)
    assert (answered["status"], passed_on) == (200, 0)
    await sync_to_async(revoke_token)(row.pk)
    for key, (_expires, token) in list(token_cache.entries.items()):
        token_cache.entries[key] = (0.0, token)
    plain, answered, passed_on = await both(apps, PATH + "ingest", body, token=raw)
    assert passed_on == 0 and answered == plain and plain["status"] == 401
    assert json.loads(plain["body"])["error"]["code"] == "unauthorized"


async def test_other_middleware_sends_every_call_to_django(home, tokens, canned, settings):
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "django.middleware.gzip.GZipMiddleware"]
    django_app = Spy(ASGIStaticFilesHandler(get_asgi_application()))
    r = await asgi(LeanHookRoutes(django_app), PATH + "ingest", json.dumps(VALID[H.INGEST]).encode(),
                   token=tokens[Role.AGENT])
    assert r["status"] == 200 and django_app.calls == 1


async def test_a_client_that_disconnects_cancels_its_call(apps, tokens, monkeypatch):
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def waits_forever(hook, request):
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    monkeypatch.setattr(hook_service, "call_hook", waits_forever)
    _django_app, lean = apps
    r = await asgi(lean, PATH + "ingest", json.dumps(VALID[H.INGEST]).encode(), token=tokens[Role.AGENT],
                   disconnect_when=started)  # the client hangs up once its call is under way
    assert started.is_set() and cancelled.is_set() and r["status"] is None


# ---- deadline and fallback without a ContextEngine ----

def test_the_hook_policy_follows_the_engines_deadline_and_fallback(home):
    make_plugin(home.plugins_dir, "slow", {"ingest": "print('{}')", "assemble": "print('{}')"},
                toml_extra="hook_timeout_secs = 3\nmax_retries = 2\nretry_delay_ms = 500")
    make_plugin(home.plugins_dir, "quick", {"ingest": "print('{}')", "bootstrap": "print('{}')"},
                toml_extra="hook_timeout_secs = 1")
    write_config(home.root, stack=["slow", "quick"], extra="context_window_tokens = 1000")
    policy = HookPolicy(catalog(), config_cache(), NullMemory())
    engine = get_engine()
    requests = {**VALID, H.COMPACT: {"messages": [{"role": "user", "content": "x " * 400}]}}
    for hook in H.ALL_HOOKS:
        assert policy.deadline_secs(hook) == engine.deadline_secs(hook) == hook_policy().deadline_secs(hook), hook
        assert policy.fallback(hook, requests[hook], "why") == engine.default(hook, requests[hook], "why").to_dict()
    assert policy.deadline_secs(H.INGEST) == 3 * 3 + 0.5 + 1.0  # the slower ingest layer, not the sum
    write_config(home.root)
    assert policy.deadline_secs(H.BOOTSTRAP) == engine.deadline_secs(H.BOOTSTRAP) == 60.0
    assert hook_policy().deadline_secs(H.BOOTSTRAP) == 60.0


async def test_a_tokens_use_is_noted_off_the_calls_path_at_most_once_a_minute(apps, canned, monkeypatch):
    from plugins_app import auth
    from plugins_app.models import ApiToken

    row, raw = await sync_to_async(create_token)("lean-touch", Role.AGENT)
    written, touches = threading.Event(), []

    def recording(token):
        touches.append(token.pk)
        original(token)
        written.set()

    original = auth._touch_in_background
    monkeypatch.setattr(auth, "_touch_in_background", recording)
    body = json.dumps(VALID[H.INGEST]).encode()
    _django_app, lean = apps
    assert (await asgi(lean, PATH + "ingest", body, token=raw))["status"] == 200
    assert await asyncio.get_running_loop().run_in_executor(None, written.wait, 10)
    noted = (await ApiToken.objects.aget(pk=row.pk)).last_used_at
    assert noted is not None
    for key, (_expires, token) in list(token_cache.entries.items()):
        token_cache.entries[key] = (0.0, token)  # the next call looks the token up again: not due yet
    assert (await asgi(lean, PATH + "ingest", body, token=raw))["status"] == 200
    assert touches == [row.pk]
    assert (await ApiToken.objects.aget(pk=row.pk)).last_used_at == noted


async def test_the_hook_path_answers_without_building_the_engine(apps, tokens, monkeypatch):
    from plugins_app import bus

    async def unreachable(*args, **kwargs):
        raise bus.BusUnavailable("connection refused")

    monkeypatch.setattr(bus, "submit_and_wait", unreachable)
    get_engine.cache_clear()
    _django_app, lean = apps
    r = await asgi(lean, PATH + "ingest", json.dumps(VALID[H.INGEST]).encode(), token=tokens[Role.AGENT])
    body = json.loads(r["body"])
    assert r["status"] == 200 and body["source"] == "default" and body["type"] == "ingest_result"
    assert body["fallback_reason"] == "bus_unavailable: connection refused"
    assert get_engine.cache_info().currsize == 0
