"""librefang_client.adapters.openai_agents with the real openai-agents package (pinned in the dev extra) driving
real turns through its Runner, with a model of the test's own (no network): the first session's turn is stored by
the service, a new session recalls it through openai-agents' own input preparation, and the session keeps its
items as openai-agents expects."""

from __future__ import annotations

import pytest
from agents import Agent, Model, ModelResponse, Runner, Usage
from agents.memory import Session
from librefang_client import LibreFang
from librefang_client.adapters.openai_agents import RECALL_HEADER, LibreFangSession
from openai.types.responses import ResponseOutputMessage, ResponseOutputText

from tests.e2e.live import running_service
from tests.waiting import wait_until


class ScriptedModel(Model):
    """Answers from what it is given: it repeats any recall it finds in its input, else acknowledges."""

    def __init__(self):
        self.inputs: list[list[dict]] = []

    async def get_response(self, system_instructions, input, model_settings, tools, output_schema, handoffs,
                           tracing, *, previous_response_id=None, conversation_id=None, prompt=None):
        items = [dict(i) for i in input] if isinstance(input, list) else [{"role": "user", "content": input}]
        self.inputs.append(items)
        recalled = [i["content"] for i in items if i.get("role") == "developer"]
        text = f"From memory: {recalled[0]}" if recalled else "Noted."
        message = ResponseOutputMessage(id=f"msg_{len(self.inputs)}", type="message", role="assistant",
                                        status="completed",
                                        content=[ResponseOutputText(type="output_text", text=text, annotations=[])])
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args, **kwargs):
        raise NotImplementedError


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    with running_service(tmp_path_factory.mktemp("adapters")) as live:
        yield live


async def test_it_remembers_a_session_and_recalls_it_in_a_new_one(service):
    model = ScriptedModel()
    agent = Agent(name="chef", instructions="You cook.", model=model)
    first = LibreFangSession("monday", agent_id="chef-bot", peer_id="alex", url=service.url, token=service.token)
    assert isinstance(first, Session)  # openai-agents' own protocol check

    result = await Runner.run(agent, "I'm allergic to hazelnuts", session=first,
                              run_config=first.run_config(tracing_disabled=True))
    assert result.final_output == "Noted."
    assert [i.get("role") for i in map(dict, await first.get_items())] == ["user", "assistant"]

    lf = LibreFang(service.url, service.token)
    wait_until(lambda: lf.memories.list("chef-bot", session_id="monday", include_shared=False).items, 30,
               "the turn stored by a worker")
    stored = lf.memories.list("chef-bot", session_id="monday").items[0]
    assert stored.content == "User: I'm allergic to hazelnuts\nAssistant: Noted." and stored.peer_id == "alex"

    second = LibreFangSession("tuesday", agent_id="chef-bot", peer_id="alex", url=service.url, token=service.token)
    result = await Runner.run(agent, "Which nuts am I allergic to?", session=second,
                              run_config=second.run_config(tracing_disabled=True))
    given = model.inputs[-1]
    assert given[0]["role"] == "developer" and given[0]["content"].startswith(RECALL_HEADER)
    assert "allergic to hazelnuts" in given[0]["content"] and given[-1]["content"] == "Which nuts am I allergic to?"
    assert "allergic to hazelnuts" in result.final_output
    assert [i.get("role") for i in map(dict, await second.get_items())] == ["user", "assistant"]  # recall not kept

    other = LibreFangSession("x", agent_id="chef-bot", peer_id="sam", url=service.url, token=service.token)
    await Runner.run(agent, "Which nuts am I allergic to?", session=other,
                     run_config=other.run_config(tracing_disabled=True))
    assert all(i.get("role") != "developer" for i in model.inputs[-1])  # another peer recalls nothing of alex


async def test_it_keeps_pops_and_clears_the_sessions_items(service):
    session = LibreFangSession("s", agent_id="chef-bot", url=service.url, token=service.token)
    await session.add_items([{"role": "user", "content": "one"}, {"role": "user", "content": "two"}])
    assert [i["content"] for i in await session.get_items(limit=1)] == ["two"]
    assert (await session.pop_item())["content"] == "two"
    await session.clear_session()
    assert await session.get_items() == [] and await session.pop_item() is None


async def test_it_runs_the_turn_when_the_service_is_unreachable(caplog):
    from librefang_client import AsyncLibreFang, RetryPolicy

    from tests.e2e.live import free_port

    down = AsyncLibreFang(f"http://127.0.0.1:{free_port()}", "t", retry=RetryPolicy(max_retries=1, backoff=0.01))
    session = LibreFangSession("s", agent_id="chef-bot", client=down)
    result = await Runner.run(Agent(name="chef", model=ScriptedModel()), "hello", session=session,
                              run_config=session.run_config(tracing_disabled=True))
    assert result.final_output == "Noted." and len(await session.get_items()) == 2
    assert "recalled nothing" in caplog.text and "did not store the turn" in caplog.text
