"""The smaller holes of issue 11 (each closed with a real test): websocket paths no route matches, hook output
nested too deep to parse, one role table for API and dashboard, owner-only files under $LIBREFANG_HOME, and
login throttling."""

from __future__ import annotations

import json

import pytest
from channels.testing import WebsocketCommunicator

from engine import protocol as P
from engine.runner import HookCall, run_hook
from engine.runtimes import resolve_tag

DEEP = 100_000


# ---- /ws/… paths no route matches ----

@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("path", ["/ws/stderr/../../x/", "/ws/nothing-here/", "/ws/stderr/a/b/c/"])
async def test_it_closes_unknown_websocket_paths_with_4404_instead_of_failing(path):
    from librefang_site.asgi import application

    comm = WebsocketCommunicator(application, path)
    connected, _ = await comm.connect(timeout=5)
    assert connected
    closed = await comm.receive_output(timeout=5)
    assert closed == {"type": "websocket.close", "code": 4404, "reason": "no such websocket route"}
    await comm.wait(timeout=5)


# ---- hook output nested too deep ----

def test_it_treats_json_nested_deeper_than_the_limit_as_text():
    deep = "[" * DEEP + "]" * DEEP
    assert P.parse_output("note\n" + deep) == {"text": "note\n" + deep}
    at_limit = "[" * P.MAX_JSON_DEPTH + "]" * P.MAX_JSON_DEPTH
    assert P.json_depth(P.parse_output(at_limit)) == P.MAX_JSON_DEPTH
    one_more = '{"a": ' * (P.MAX_JSON_DEPTH + 1) + "1" + "}" * (P.MAX_JSON_DEPTH + 1)
    assert P.parse_output(one_more) == {"text": one_more}
    # an earlier line that parses still wins over a too-deep last line (bottom-up scan)
    assert P.parse_output('{"ok": true}\n' + deep) == {"ok": True}


def test_it_answers_a_hook_printing_deeply_nested_json_with_the_text_fallback(tmp_path):
    plugin = tmp_path / "deep"
    (plugin / "hooks").mkdir(parents=True)
    (plugin / "hooks" / "ingest.py").write_text(
        f"import sys\nsys.stdin.read()\nprint('[' * {DEEP} + ']' * {DEEP})\n")
    call = HookCall(plugin_dir=plugin, script="hooks/ingest.py", runtime=resolve_tag("python"),
                    request={"type": "ingest", "message": "hi", "agent_id": "a1"}, timeout_secs=30,
                    data_dir=tmp_path / "data")
    result = run_hook(call)
    assert result.ok, result.failure
    assert result.reply == {"text": "[" * DEEP + "]" * DEEP}
    json.dumps(result.to_dict())  # the reply travels on as JSON without a RecursionError
