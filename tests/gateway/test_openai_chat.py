"""The gateway's Chat Completions through the real ``openai`` SDK, on a scripted fake engine: the recorded
trajectory is the one our tool loop records for the same conversation."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest
from openai.types.chat import ChatCompletionFunctionToolParam

from agentloop_grpc.agent import AgentLoopConfig, Sample, SamplingConfig
from agentloop_grpc.gateway.config import ForcedSampling, GatewayConfig

from ..agent.conftest import call, loop_context
from .conftest import scripted_gateway

QUESTION = [{"role": "user", "content": "What is 2 + 3?"}]
REPLIES = [call("calculator", expression="2+3"), "The answer is 5."]
#: Greedy in both: the fake engine's logprobs of an unseeded sampled request are drawn at random.
GREEDY = GatewayConfig(sampling=ForcedSampling(temperature=0.0))


async def tool_loop_trajectory(codec):
    config = AgentLoopConfig(sampling=SamplingConfig(temperature=0.0))
    async with loop_context(codec, REPLIES, config) as (ctx, loops, _):
        t = await loops.get("tool").run(Sample(sample_id="s1", messages=tuple(QUESTION), tools=("calculator",)))
        return t, [ctx.tool_specs["calculator"].openai()]


async def test_an_agent_through_the_openai_sdk_records_what_the_tool_loop_records(codec):
    expected, tools = await tool_loop_trajectory(codec)
    async with scripted_gateway(codec, REPLIES, GREEDY) as g:
        client = g.openai("s1")
        first = await client.chat.completions.create(model="m", messages=QUESTION, tools=tools)
        message = first.choices[0].message
        assert first.choices[0].finish_reason == "tool_calls"
        assert message.tool_calls is not None
        (tool_call,) = message.tool_calls
        assert tool_call.function.name == "calculator"
        assert json.loads(tool_call.function.arguments) == {"expression": "2+3"}
        history = [*QUESTION, message.model_dump(exclude_none=True),
                   {"role": "tool", "tool_call_id": tool_call.id, "content": "5"}]
        second = await client.chat.completions.create(model="m", messages=history, tools=tools)
        assert second.choices[0].message.content == "The answer is 5."
        assert second.choices[0].finish_reason == "stop"
        session, (t,) = await g.gateway.finish("s1")
    assert session.forks == []
    assert t.prompt_ids == expected.prompt_ids
    assert t.response_ids == expected.response_ids
    assert t.response_mask == expected.response_mask
    assert t.response_logprobs == expected.response_logprobs
    assert t.weight_versions == expected.weight_versions
    assert t.drift is None and t.assistant_turns == 2 and t.tool_calls == 1
    # the token ids the client got are the engine's, exactly
    assert first.model_extra["agentloop"]["token_ids"] == list(t.response_ids[: len(first.model_extra["agentloop"]
                                                                                   ["token_ids"])])


async def test_streams_text_with_logprobs_and_a_tool_call_turn_streams_the_call(codec):
    async with scripted_gateway(codec, ["Hello there, friend.", call("calculator", expression="1+1")]) as g:
        client = g.openai("s2")
        stream = await client.chat.completions.create(
            model="m", messages=QUESTION, stream=True, logprobs=True, top_logprobs=2,
            stream_options={"include_usage": True})
        pieces, logprobs, usage, ends = [], [], None, []
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                pieces.append(choice.delta.content or "")
                if choice.logprobs and choice.logprobs.content:
                    logprobs += choice.logprobs.content
                if choice.finish_reason:
                    ends.append(choice.finish_reason)
        assert "".join(pieces) == "Hello there, friend." and ends == ["stop"]
        assert len(pieces) > 2  # it streamed, not one piece at the end
        assert "".join(t.token for t in logprobs) == "Hello there, friend."
        assert all(len(t.top_logprobs) == 2 for t in logprobs)
        assert usage.completion_tokens == len(codec.encode("Hello there, friend.")) + 1  # and the end of turn
        # a turn offered tools streams its call whole, once parsed
        history = [*QUESTION, {"role": "assistant", "content": "Hello there, friend."},
                   {"role": "user", "content": "Add 1 and 1."}]
        stream = await client.chat.completions.create(model="m", messages=history, stream=True, tools=[TOOL])
        calls = [c async for chunk in stream for choice in chunk.choices for c in (choice.delta.tool_calls or [])]
        assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
            ("calculator", {"expression": "1+1"})]
        session, trajectories = await g.gateway.finish("s2")
    # tools offered where the first turn had none render another prompt: a new chain, the reason said
    assert [f.reason for f in session.forks] == ["the tools offered differ from chain 0's"]
    assert [t.assistant_turns for t in trajectories] == [1, 1]


TOOL: ChatCompletionFunctionToolParam = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate arithmetic.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}


async def test_a_client_that_reserialises_the_call_still_appends_and_a_rewritten_history_forks(codec):
    replies = [call("calculator", expression="2+3", precision=2), "Five.", "Ok."]
    async with scripted_gateway(codec, replies) as g:
        client = g.openai("s3")
        first = (await client.chat.completions.create(model="m", messages=QUESTION, tools=[TOOL])).choices[0]
        assert first.message.tool_calls is not None
        (sent,) = first.message.tool_calls
        # the client renames the call id, reorders and respaces the JSON, adds whitespace to the content
        arguments = json.dumps(dict(reversed(list(json.loads(sent.function.arguments).items()))), indent=2)
        echo = {"role": "assistant", "content": "  ", "tool_calls": [
            {"id": "call_renamed", "type": "function", "function": {"name": "calculator", "arguments": arguments}}]}
        history = [*QUESTION, echo, {"role": "tool", "tool_call_id": "call_renamed", "content": "5"}]
        second = await client.chat.completions.create(model="m", messages=history, tools=[TOOL])
        assert second.model_extra["agentloop"] == {**second.model_extra["agentloop"], "chain": 0, "forked": False}
        # a compacted history (the tool turn dropped) forks a new chain
        compacted = [*QUESTION, {"role": "user", "content": "Summarise."}]
        third = await client.chat.completions.create(model="m", messages=compacted, tools=[TOOL])
        assert third.model_extra["agentloop"]["forked"] is True
        session, trajectories = await g.gateway.finish("s3")
    assert [t.sample_id for t in trajectories] == ["s3", "s3/fork-1"]
    assert trajectories[0].assistant_turns == 2 and trajectories[1].assistant_turns == 1
    assert len(session.forks) == 1 and "history differs from the chain at message 1" in session.forks[0].reason
    assert all(t.drift is None for t in trajectories)
    # the fork's prompt is the compacted conversation, encoded as a first prompt is
    assert list(trajectories[1].prompt_ids) == codec.prompt_ids(compacted, [TOOL])


async def test_an_assistant_turn_the_gateway_did_not_produce_forks_a_chain(codec):
    """An agent that appends an assistant message of its own (a few-shot example, a prefill) after the reply it
    got: those tokens were never the model's, so they start a new chain rather than enter this one."""
    async with scripted_gateway(codec, ["Five.", "Six."]) as g:
        client = g.openai("s6")
        first = (await client.chat.completions.create(model="m", messages=QUESTION)).choices[0]
        history = [*QUESTION, {"role": "assistant", "content": first.message.content},
                   {"role": "user", "content": "And 3 + 3?"}, {"role": "assistant", "content": "Let me think."},
                   {"role": "user", "content": "Go on."}]
        second = await client.chat.completions.create(model="m", messages=history)
        assert second.model_extra["agentloop"]["forked"] is True
        session, trajectories = await g.gateway.finish("s6")
    assert [t.sample_id for t in trajectories] == ["s6", "s6/fork-1"]
    assert [t.assistant_turns for t in trajectories] == [1, 1]
    assert len(session.forks) == 1
    assert "message 3 is an assistant turn the gateway did not produce" in session.forks[0].reason
    assert list(trajectories[1].prompt_ids) == codec.prompt_ids(history, [])


async def test_two_requests_of_one_session_at_once_fork_and_both_are_recorded(codec):
    async with scripted_gateway(codec, ["One.", "Two."], engine={"token_latency_s": 0.01}) as g:
        client = g.openai("s4")
        a, b = await asyncio.gather(
            client.chat.completions.create(model="m", messages=QUESTION),
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Another."}]))
        assert {a.model_extra["agentloop"]["chain"], b.model_extra["agentloop"]["chain"]} == {0, 1}
        session, trajectories = await g.gateway.finish("s4")
    assert len(trajectories) == 2 and len(session.forks) == 1


async def test_the_sync_client_works_too(codec):
    async with scripted_gateway(codec, ["Sync."]) as g:
        def ask():
            with openai.OpenAI(base_url=g.base_url("s5"), api_key="none") as client:
                return client.chat.completions.create(model="m", messages=QUESTION, max_tokens=64, seed=7,
                                                      temperature=0.5, top_p=0.9, stop=["never"])
        reply = await asyncio.to_thread(ask)  # the sync client blocks: off the loop that serves it
        assert reply.choices[0].message.content == "Sync."
        sampling = g.script.requests[-1].sampling
        assert (sampling.max_new_tokens, sampling.seed, sampling.temperature) == (64, 7, 0.5)
        assert sampling.top_p == pytest.approx(0.9)  # float on the wire
        assert sampling.logprobs  # always recorded, though the client did not ask


async def test_a_session_can_be_finished_as_soon_as_its_reply_is_read(codec):
    # a streamed reply's last bytes reach the client before the server's stream is closed: a client that finishes
    # its session at once found it still "in flight" (409) under load
    from agentloop_grpc.gateway.exchange import ChatReply, ChatRequest

    async with scripted_gateway(codec, ["Done."]) as g:
        events = g.gateway.chat_stream("f1", ChatRequest(messages=tuple(QUESTION), stream=True))
        async for event in events:
            if isinstance(event, ChatReply):
                break  # the reply is read; the stream is not closed yet
        session, (t,) = await g.gateway.finish("f1")
        await events.aclose()
    assert t.assistant_turns == 1 and session.in_flight == 0
