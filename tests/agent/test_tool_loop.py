"""The tool loop against a scripted fake engine: masks, logprob alignment, template deltas, tools, limits."""

from __future__ import annotations

import json

from agentloop_grpc.agent import AgentLoopConfig, Sample, Termination

from .conftest import EOS, WatchedRouter, call, loop_context

QUESTION = ({"role": "user", "content": "What is 2 + 3?"},)


def segments(mask):
    """[(value, start, end)] runs of the mask."""
    runs, start = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            runs.append((mask[start], start, i))
            start = i
    return runs


async def test_two_turns_with_a_tool_are_token_exact(codec):
    replies = [call("calculator", expression="2+3"), "The answer is 5."]
    async with loop_context(codec, replies) as (ctx, loops, _):
        t = await loops.get("tool").run(Sample(sample_id="s1", messages=QUESTION, tools=("calculator",)))
    assert t.termination is Termination.NO_TOOL_CALL and t.error is None
    assert t.assistant_turns == 2 and t.tool_calls == 1 and t.tool_errors == 0
    tool_specs = [ctx.tool_specs["calculator"].openai()]
    assert list(t.prompt_ids) == codec.prompt_ids(list(QUESTION), tool_specs)
    # model tokens exactly as scripted (+ eos), then the template delta (mask 0), then the second reply
    first, second = codec.encode(replies[0]) + [EOS], codec.encode(replies[1]) + [EOS]
    runs = segments(t.response_mask)
    assert [r[0] for r in runs] == [1, 0, 1]
    assert list(t.response_ids[runs[0][1] : runs[0][2]]) == first
    assert list(t.response_ids[runs[2][1] : runs[2][2]]) == second
    delta = codec.decode(t.response_ids[runs[1][1] : runs[1][2]])
    assert delta == "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    # logprobs aligned: real (< 0) on model tokens, 0 elsewhere; versions likewise
    for mask, logprob, version in zip(t.response_mask, t.response_logprobs, t.weight_versions, strict=True):
        assert (logprob < 0 and version == 0) if mask else (logprob == 0 and version == -1)
    # the whole sequence is what the template renders for the conversation: no drift
    assert t.drift is None
    assert t.messages[-3]["tool_calls"][0]["function"] == {"name": "calculator", "arguments": {"expression": "2+3"}}
    assert t.messages[-2] == {"role": "tool", "name": "calculator", "content": "5"}
    assert t.messages[-1] == {"role": "assistant", "content": "The answer is 5."}


async def test_final_tool_ends_the_episode_and_rewards(codec):
    replies = [call("calculator", expression="2+3"), call("check_answer", answer="5")]
    async with loop_context(codec, replies) as (_, loops, _s):
        t = await loops.get("tool").run(Sample(
            sample_id="s", messages=QUESTION, tools_kwargs={"check_answer": {"ground_truth": "5"}}, ground_truth="5"
        ))
    assert t.termination is Termination.STOP and t.assistant_turns == 2
    assert t.reward == 1.0 and t.tool_rewards == (0.0, 1.0)
    assert t.response_mask[-1] == 1 and t.response_ids[-1] == EOS  # nothing appended after the final call


async def test_wrong_final_answer_scores_zero(codec):
    async with loop_context(codec, [call("check_answer", answer="6")]) as (_, loops, _s):
        t = await loops.get("tool").run(Sample(
            sample_id="s", messages=QUESTION, tools_kwargs={"check_answer": {"ground_truth": "5"}}
        ))
    assert t.termination is Termination.STOP and t.reward == 0.0


async def test_parallel_calls_beyond_the_limit_get_an_error_message(codec):
    replies = ["\n".join(call("calculator", expression=f"{i}*2") for i in range(3)), "done"]
    config = AgentLoopConfig(max_parallel_tool_calls=2)
    async with loop_context(codec, replies, config) as (_, loops, _s):
        t = await loops.get("tool").run(Sample(sample_id="s", messages=QUESTION))
    tool_messages = [m for m in t.messages if m["role"] == "tool"]
    assert [m["content"] for m in tool_messages[:2]] == ["0", "2"]
    assert "at most 2 tool calls" in tool_messages[2]["content"]
    assert t.tool_calls == 3 and t.tool_errors == 1 and t.drift is None


async def test_malformed_call_is_answered_and_counted(codec):
    replies = ['<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+1"\n</tool_call>', "ok"]
    async with loop_context(codec, replies) as (_, loops, _s):
        t = await loops.get("tool").run(Sample(sample_id="s", messages=QUESTION))
    assert t.malformed_tool_calls == 1 and t.tool_errors == 1 and t.assistant_turns == 2
    error = next(m for m in t.messages if m["role"] == "tool")["content"]
    assert error.startswith("Error: the tool call could not be parsed: the call is not valid JSON")
    assert t.termination is Termination.NO_TOOL_CALL


async def test_tool_error_and_unknown_tool_reach_the_model(codec):
    replies = [call("calculator", expression="1/0") + "\n" + call("calculator", expression="os.system()") + "\n"
               + call("web_search", q="x"), "ok"]
    async with loop_context(codec, replies) as (_, loops, _s):
        t = await loops.get("tool").run(Sample(sample_id="s", messages=QUESTION, tools=("calculator",)))
    contents = [m["content"] for m in t.messages if m["role"] == "tool"]
    assert contents[0] == "Error (exception): ZeroDivisionError: division by zero"
    assert contents[1].startswith("Error (invalid_arguments): invalid arguments for calculator: expression:")
    assert contents[2].startswith("Error: unknown tool 'web_search'; available: calculator")
    assert t.tool_errors == 3 and t.failed is False


async def test_long_tool_responses_are_truncated_on_the_configured_side(codec):
    digits = str(10**300)
    for side, check in [
        ("right", lambda c: c.startswith("1000") and c.endswith("...(truncated)...")),
        ("left", lambda c: c.startswith("...(truncated)...") and c.endswith("000")),
        ("middle", lambda c: c.startswith("1000") and "...(truncated)..." in c and c.endswith("000")),
    ]:
        config = AgentLoopConfig(max_tool_response_chars=60, tool_response_truncation=side)
        async with loop_context(codec, [call("calculator", expression="10**300"), "ok"], config) as (_, loops, _s):
            t = await loops.get("tool").run(Sample(sample_id=f"s-{side}", messages=QUESTION))
        content = next(m["content"] for m in t.messages if m["role"] == "tool")
        assert len(content) == 60 and len(digits) > 60 and check(content), (side, content)


async def test_turn_limit(codec):
    config = AgentLoopConfig(max_assistant_turns=3)
    async with loop_context(codec, [call("calculator", expression="1+1")], config) as (_, loops, script):
        t = await loops.get("tool").run(Sample(sample_id="s", messages=QUESTION))
    assert t.termination is Termination.TURN_LIMIT and t.assistant_turns == 3 and t.tool_calls == 3
    assert len(script.requests) == 3 and t.response_mask[-1] == 1  # the last turn's tool output is not appended


async def test_response_budget_and_turn_length(codec):
    reply = call("calculator", expression="1+1")
    n = len(codec.encode(reply)) + 1
    budget = AgentLoopConfig(response_budget=n + 5)  # the first turn fits, its tool response does not
    async with loop_context(codec, [reply], budget) as (_, loops, _s):
        t = await loops.get("tool").run(Sample(sample_id="s", messages=QUESTION))
    assert t.termination is Termination.LENGTH and len(t.response_ids) == n and t.assistant_turns == 1
    per_turn = AgentLoopConfig(max_new_tokens_per_turn=5)
    async with loop_context(codec, [reply], per_turn) as (_, loops, _s):
        t = await loops.get("tool").run(Sample(sample_id="s", messages=QUESTION))
    assert t.termination is Termination.LENGTH and len(t.response_ids) == 5 and t.tool_calls == 0
    assert len(t.response_ids) <= per_turn.response_budget


async def test_prompt_too_long_is_a_sample_error_not_infrastructure(codec):
    config = AgentLoopConfig(max_prompt_tokens=10)
    async with loop_context(codec, ["hi"], config) as (_, loops, _s):
        from agentloop_grpc.agent import AgentLoopWorker

        [t] = await AgentLoopWorker(loops).run([Sample(sample_id="s", messages=QUESTION)])
    assert t.failed and not t.infrastructure_failure and "max_prompt_tokens=10" in t.error


async def test_interaction_feedback_then_retry(codec):
    replies = ["I think it is 4.", "Sorry, it is 5."]
    async with loop_context(codec, replies) as (_, loops, _s):
        t = await loops.get("tool").run(Sample(
            sample_id="s", messages=QUESTION, tools=(), interaction="retry", ground_truth="5"
        ))
    assert t.termination is Termination.STOP and t.assistant_turns == 2 and t.user_turns == 1
    assert t.turn_scores == (0.0, 1.0) and t.reward == 1.0
    assert t.messages[2] == {"role": "user", "content": "That is not correct. Check your work and try again."}
    assert [r[0] for r in segments(t.response_mask)] == [1, 0, 1] and t.drift is None


async def test_user_turn_limit(codec):
    config = AgentLoopConfig(max_user_turns=1)
    async with loop_context(codec, ["It is 4."], config) as (_, loops, _s):
        t = await loops.get("tool").run(Sample(
            sample_id="s", messages=QUESTION, tools=(), interaction="retry", ground_truth="5"
        ))
    assert t.termination is Termination.TURN_LIMIT and t.user_turns == 1 and t.assistant_turns == 2


async def test_drift_is_reported_or_fails_in_strict_mode(codec):
    canonical = codec.encode("hello world")
    split = codec.encode("hel") + codec.encode("lo world")  # same text, a tokenization the template never makes
    assert canonical != split and codec.decode(split) == "hello world"
    for mode in ("report", "strict"):
        config = AgentLoopConfig(drift_check=mode)
        async with loop_context(codec, [split], config) as (_, loops, _s):
            t = await loops.get("single_turn").run(Sample(sample_id="s", messages=QUESTION))
        assert list(t.response_ids[: len(split)]) == split  # the model's ids are kept, never re-tokenized
        position = len(t.prompt_ids) + len(codec.encode("hel")) - 1
        if mode == "report":
            assert t.termination is Termination.STOP and t.drift is not None
            assert t.drift.position <= position + 1
        else:
            assert t.failed and "drift" in t.error and not t.infrastructure_failure


async def test_single_turn(codec):
    async with loop_context(codec, ["Five."]) as (_, loops, script):
        t = await loops.get("single_turn").run(Sample(sample_id="s", messages=QUESTION, loop="single_turn"))
    assert list(t.response_ids) == codec.encode("Five.") + [EOS] and set(t.response_mask) == {1}
    assert t.termination is Termination.STOP and t.messages[-1] == {"role": "assistant", "content": "Five."}
    assert "# Tools" not in codec.decode(script.requests[0].prompt_ids)


async def test_per_turn_sampling_reaches_the_engine(codec):
    from agentloop_grpc.agent import SamplingConfig

    config = AgentLoopConfig(
        sampling=SamplingConfig(temperature=0.7, seed=5), turn_sampling=(SamplingConfig(temperature=0.0),)
    )
    async with loop_context(codec, [call("calculator", expression="1"), "x"], config) as (_, loops, script):
        await loops.get("tool").run(Sample(sample_id="s", messages=QUESTION))
    first, second = (r.sampling for r in script.requests)
    assert first.temperature == 0.0 and abs(second.temperature - 0.7) < 1e-6 and second.seed is not None
    assert first.logprobs and second.logprobs


async def test_trace_has_one_record_per_turn(codec, tmp_path):
    from agentloop_grpc.agent import JsonlTracer
    from agentloop_grpc.agent.tracing import read_trace

    tracer = JsonlTracer(tmp_path / "trace.jsonl")
    async with loop_context(codec, [call("calculator", expression="2+3"), "5"], tracer=tracer) as (_, loops, _s):
        t = await loops.get("tool").run(Sample(sample_id="s", messages=QUESTION))
    tracer.close()
    records = read_trace(tmp_path / "trace.jsonl")
    assert [r["kind"] for r in records] == ["assistant", "tool", "assistant", "end"]
    assert sum(len(r["token_ids"]) for r in records) == len(t.response_ids)
    assert records[0]["tool_calls"][0]["function"]["name"] == "calculator" and records[0]["server"]
    assert json.loads(json.dumps(records))  # plain JSON


async def _pause_abort_midway(ctx, sample, tokens_first: int):
    """Run ``sample``; once ``tokens_first`` of its tokens arrived, Pause(ABORT) then Resume the engine."""
    import asyncio
    import dataclasses

    from agentloop_grpc.agent import LoopRegistry
    from agentloop_grpc.common.types import PauseMode

    watched = WatchedRouter(ctx.generator)
    loops = LoopRegistry.default(dataclasses.replace(ctx, generator=watched))
    task = asyncio.create_task(loops.get(sample.loop).run(sample))
    await watched.wait(lambda: watched.tokens.get(sample.sample_id, 0) >= tokens_first)
    (await ctx.generator.fleet.pause(PauseMode.ABORT)).raise_for_errors()
    (await ctx.generator.fleet.resume()).raise_for_errors()
    return await task, watched


async def test_an_aborted_generation_resumes_from_its_tokens(codec):
    reply = "one two three four five six seven eight nine ten " * 3
    async with loop_context(codec, [reply], engine={"token_latency_s": 0.01}) as (ctx, _loops, script):
        t, watched = await _pause_abort_midway(ctx, Sample(sample_id="s", messages=QUESTION, loop="single_turn"), 5)
    # the Router resumed it: one call, two engine requests, the second carrying the first's tokens
    assert [(r.finish_reason.value, r.resumes) for r in watched.results] == [("stop", 1)]
    assert t.resumed_generations == 1 and len(script.requests) == 2
    assert len(script.requests[1].prompt_ids) > len(script.requests[0].prompt_ids)
    assert list(t.response_ids) == codec.encode(reply) + [EOS]  # nothing lost, nothing twice
    assert t.termination is Termination.STOP


async def test_resume_can_be_turned_off(codec):
    reply = "one two three four five six seven eight nine ten " * 3
    config = AgentLoopConfig(resume_on_abort=False)
    async with loop_context(codec, [reply], config, engine={"token_latency_s": 0.01}) as (ctx, _loops, _s):
        t, _ = await _pause_abort_midway(ctx, Sample(sample_id="s", messages=QUESTION, loop="single_turn"), 5)
    assert t.failed and "resume_on_abort is off" in t.error and not t.infrastructure_failure


async def test_the_tool_round_that_ends_the_episode_is_traced_without_tokens(codec, tmp_path):
    from agentloop_grpc.agent import JsonlTracer
    from agentloop_grpc.agent.tracing import read_trace

    tracer = JsonlTracer(tmp_path / "trace.jsonl")
    replies = [call("calculator", expression="2+3"), call("check_answer", answer="5")]
    async with loop_context(codec, replies, tracer=tracer) as (_, loops, _s):
        t = await loops.get("tool").run(Sample(
            sample_id="s", messages=QUESTION, tools_kwargs={"check_answer": {"ground_truth": "5"}}, ground_truth="5"
        ))
    tracer.close()
    records = read_trace(tmp_path / "trace.jsonl")
    assert [r["kind"] for r in records] == ["assistant", "tool", "assistant", "tool", "end"]
    final = records[3]
    assert final["token_ids"] == [] and final["appended"] is False and final["seconds"] > 0
    assert final["text"]  # the check_answer tool's own answer
    assert sum(len(r["token_ids"]) for r in records) == len(t.response_ids)  # nothing counted twice
