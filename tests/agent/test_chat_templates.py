"""Chat templates set per run (config and YAML), and a codec that keeps working with templates that re-render
earlier turns differently: the recorded tokens stay the model's, the next prompt continues what the engine saw,
and the departure from a fresh render is recorded as drift instead of failing the trajectory."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from agentloop_grpc.agent import AgentLoopConfig, ChatCodec, Sample, Termination
from agentloop_grpc.agent.spec import load_codec
from agentloop_grpc.rollout.config import load_config

from .conftest import EOS, call, loop_context

#: Qwen3's template, reduced to what matters here: ChatML with tool responses as a user turn, the reasoning
#: (<think>...</think>) of assistant turns before the last user query dropped, and enable_thinking=false opening
#: the assistant with an empty think block.
QWEN3_STYLE = """
{%- if messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}{%- endif %}
{%- set ns = namespace(last_query=messages|length - 1, multi_step=true) %}
{%- for message in messages[::-1] %}
    {%- if ns.multi_step and message.role == 'user' %}
        {%- set ns.multi_step = false %}
        {%- set ns.last_query = messages|length - 1 - loop.index0 %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.role == 'system' and loop.first %}
    {%- elif message.role == 'assistant' %}
        {%- set content = message.content %}
        {%- set reasoning = '' %}
        {%- if '</think>' in content %}
            {%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query and (loop.last or reasoning) %}
            {{- '<|im_start|>assistant\\n<think>\\n' + reasoning + '\\n</think>\\n\\n' + content + '<|im_end|>\\n' }}
        {%- else %}
            {{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}
        {%- endif %}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
        {{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}
{%- endif %}
"""

#: A template that re-serialises the JSON of past turns compactly (as templates that render parsed tool calls do).
COMPACT_JSON = (
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' }}"
    "{%- if message.role == 'assistant' and not loop.last %}{{- message.content | replace('\": ', '\":') }}"
    "{%- else %}{{- message.content }}{%- endif %}{{- '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

QUESTION = ({"role": "user", "content": "What is 2 + 3?"},)
THOUGHT = "<think>\nadd them\n</think>\n\n"


@pytest.fixture(scope="module")
def qwen3(codec) -> ChatCodec:
    return ChatCodec(codec.tokenizer, QWEN3_STYLE)


def test_delta_continues_what_the_engine_saw_when_the_template_strips_reasoning(qwen3):
    history = [*QUESTION, {"role": "assistant", "content": THOUGHT + "It is 4."}]
    retry = [{"role": "user", "content": "Try again."}]
    before = qwen3.render(history)
    after = qwen3.render([*history, *retry], add_generation_prompt=True)
    assert "add them" in before and "add them" not in after  # no render of the past is a prefix of the next
    delta = qwen3.delta_ids(history, retry, None, stopped_on=EOS)
    assert qwen3.decode(delta) == "\n<|im_start|>user\nTry again.<|im_end|>\n<|im_start|>assistant\n"


def test_delta_is_unchanged_for_a_template_that_keeps_the_past(codec):
    history = [*QUESTION, {"role": "assistant", "content": "It is 4."}]
    retry = [{"role": "user", "content": "Try again."}]
    before = codec.render(history)
    after = codec.render([*history, *retry], add_generation_prompt=True)
    assert codec.delta_ids(history, retry, None, EOS) == codec.encode(codec.separator(EOS) + after[len(before):])


async def test_interaction_with_a_template_that_strips_reasoning(qwen3):
    replies = [THOUGHT + "I think it is 4.", THOUGHT + "Sorry, it is 5."]
    async with loop_context(qwen3, replies) as (_, loops, script):
        t = await loops.get("tool").run(Sample(
            sample_id="s", messages=QUESTION, tools=(), interaction="retry", ground_truth="5"
        ))
    assert t.termination is Termination.STOP and t.reward == 1.0 and t.assistant_turns == 2
    first = qwen3.encode(replies[0]) + [EOS]
    assert list(t.response_ids[: len(first)]) == first  # the model's ids, reasoning included, as produced
    # the second prompt is the first one, the model's turn and the delta: what the engine saw, reasoning kept
    second = list(script.requests[1].prompt_ids)
    assert second == list(t.prompt_ids) + list(t.response_ids[: len(second) - len(t.prompt_ids)])
    assert "add them" in qwen3.decode(second)
    assert t.drift is not None and t.drift.kind == "text" and t.drift.position == len(t.prompt_ids)


async def test_tool_loop_with_a_template_that_reserialises_tool_calls(codec):
    compact = ChatCodec(codec.tokenizer, COMPACT_JSON)
    replies = [call("calculator", expression="2 + 3"), "It is 5."]
    async with loop_context(compact, replies) as (_, loops, script):
        t = await loops.get("tool").run(Sample(sample_id="s", messages=QUESTION, tools=("calculator",)))
    assert t.termination is Termination.NO_TOOL_CALL and t.tool_calls == 1 and t.tool_errors == 0
    assert compact.decode(script.requests[1].prompt_ids).count('{"name": "calculator"') == 1  # as the model wrote it
    assert t.drift is not None and t.drift.kind == "text"
    assert '"name": "calculator"' in t.drift.recorded_text and '"name":"calculator"' in t.drift.rendered_text


def test_template_kwargs_reach_every_render(codec):
    config = AgentLoopConfig(chat_template=QWEN3_STYLE, chat_template_kwargs={"enable_thinking": False})
    qwen3 = load_codec(None, config)
    assert qwen3.decode(qwen3.prompt_ids(QUESTION)).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    plain = load_codec(None, config.model_copy(update={"chat_template_kwargs": {}}))
    assert plain.decode(plain.prompt_ids(QUESTION)).endswith("<|im_start|>assistant\n")


async def test_only_tokenization_drift_when_the_template_renders_what_the_engine_saw(codec):
    qwen3 = ChatCodec(codec.tokenizer, QWEN3_STYLE, {"enable_thinking": False})
    async with loop_context(qwen3, ["It is 5."]) as (_, loops, _s):
        t = await loops.get("single_turn").run(Sample(sample_id="s", messages=QUESTION))
    # same text; the prompt's closing "\n\n" merges with the model's first token in a fresh encoding, not in the
    # prompt encoded alone
    assert t.termination is Termination.STOP and t.drift is not None and t.drift.kind == "tokenization"
    assert t.drift.position < len(t.prompt_ids) and t.drift.rendered_text.startswith(t.drift.recorded_text)


def test_chat_template_from_a_file_or_text_and_from_the_yaml(tmp_path):
    path = tmp_path / "qwen3.jinja"
    path.write_text(QWEN3_STYLE)
    assert AgentLoopConfig(chat_template=str(path)).chat_template == QWEN3_STYLE
    assert AgentLoopConfig(chat_template=COMPACT_JSON).chat_template == COMPACT_JSON
    with pytest.raises(ValidationError, match="chat_template"):
        AgentLoopConfig(chat_template=str(tmp_path / "missing.jinja"))
    yaml = tmp_path / "rollout.yaml"
    yaml.write_text(
        "engines: {addresses: ['127.0.0.1:1']}\ndataset: {arithmetic: {count: 1}}\n"
        f"loop: {{chat_template: {json.dumps(str(path))}, chat_template_kwargs: {{enable_thinking: false}}}}\n"
    )
    loop = load_config(yaml).loop
    assert loop.chat_template == QWEN3_STYLE and loop.chat_template_kwargs == {"enable_thinking": False}


def test_a_template_that_does_not_render_fails_naming_the_field(codec):
    with pytest.raises(ValueError, match="chat_template"):
        ChatCodec(codec.tokenizer, "{{ messages[0].content | no_such_filter }}")


#: ChatML whose assistant turns render their parsed tool calls from the message's ``tool_calls`` after the content,
#: as Qwen2.5's and Qwen3's templates do.
TOOL_CALLS_FIELD = (
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content }}"
    "{%- if message.tool_calls %}{%- for c in message.tool_calls %}"
    "{{- '\\n<tool_call>\\n' + (c.function | tojson) + '\\n</tool_call>' }}{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


async def test_a_template_rendering_tool_calls_from_the_message_does_not_repeat_the_models_call(codec):
    """The model wrote its call as text (recorded as produced); the delta after its turn must not add the
    template's rendering of the same call again."""
    fielded = ChatCodec(codec.tokenizer, TOOL_CALLS_FIELD)
    replies = [call("calculator", expression="2 + 3"), "It is 5."]
    async with loop_context(fielded, replies) as (_, loops, script):
        t = await loops.get("tool").run(Sample(sample_id="s", messages=QUESTION, tools=("calculator",)))
    assert t.tool_calls == 1 and t.tool_errors == 0
    second = fielded.decode(script.requests[1].prompt_ids)
    assert second.count("<tool_call>") == 1 and second.count('"calculator"') == 1, second
