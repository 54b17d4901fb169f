"""Tool-call formats: each parser on samples written from its format's public documentation (Qwen3-Coder's chat
template, Meta's Llama 3.1 model card, OpenAI's harmony guide), each grammar against xgrammar's matcher, and one
tool-loop run per format against the scripted engine."""

from __future__ import annotations

import pytest

from agentloop_grpc.agent import (
    AgentLoopConfig,
    GptOssParser,
    HermesParser,
    Llama3JsonParser,
    LoopContext,
    Qwen3CoderParser,
    Sample,
    Termination,
    make_parser,
)
from agentloop_grpc.agent.parsers import stop_token_ids
from agentloop_grpc.tools.builtin.calculator import calculator
from agentloop_grpc.tools.tool import FunctionTool

from .conftest import EOS, loop_context
from .test_tool_loop import QUESTION, segments

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Forecast of a city.", "parameters": {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer"},
        "metric": {"type": "boolean"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "hours": {"type": "array", "items": {"type": "integer"}},
    },
    "required": ["city", "days"],
}}}
WRITE = {"type": "function", "function": {"name": "write_file", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
    "required": ["path", "content"],
}}}


def qwen_call(name: str, **parameters: str) -> str:
    """A call as Qwen3-Coder's chat template writes one."""
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in parameters.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


# -- Qwen3-Coder -------------------------------------------------------------------------------------------------

def test_qwen3_coder_reads_typed_parameters_and_content():
    parser = Qwen3CoderParser([WEATHER, WRITE])
    text = ("I'll check the forecast and save it.\n"
            + qwen_call("get_weather", city="San Francisco", days="3", metric="true", hours="[9, 12]") + "\n"
            + qwen_call("write_file", path="notes.md", content="line one\n  line two\n3") + "\n")
    turn = parser.parse(text)
    assert turn.content == "I'll check the forecast and save it." and turn.errors == ()
    assert [(c.name, c.arguments) for c in turn.calls] == [
        ("get_weather", {"city": "San Francisco", "days": 3, "metric": True, "hours": [9, 12]}),
        ("write_file", {"path": "notes.md", "content": "line one\n  line two\n3"}),  # a string stays text
    ]
    raw = turn.calls[0].raw
    assert raw.startswith("<tool_call>\n<function=get_weather>") and raw.endswith("</tool_call>")
    # a tool no schema names keeps its values as text
    assert Qwen3CoderParser().parse(qwen_call("get_weather", city="Oslo", days="3")).calls[0].arguments == {
        "city": "Oslo", "days": "3"}


@pytest.mark.parametrize(("text", "reason"), [
    (qwen_call("get_weather", city="Paris", days="three"), "'days' must be integer as JSON"),
    (qwen_call("get_weather", city="Paris", days="2.5"), "'days' must be integer, not '2.5'"),
    (qwen_call("get_weather", city="Paris", days="1", metric="1"), "'metric' must be boolean"),
    (qwen_call("get_weather", city="Paris", days="1").replace("<parameter=days>", "<parameter=city>"),
     "'city' is given twice"),
    ("<tool_call>\n{\"name\": \"get_weather\"}\n</tool_call>", "must hold one <function=NAME>"),
    ("<tool_call>\n<function=get_weather>\ncity: Paris\n</function>\n</tool_call>", "only <parameter=NAME>"),
    # cut off: never half a call
    ("Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nPar", "not closed with </tool_call>"),
    ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</tool_call>", "must hold one <function=NAME>"),
])
def test_qwen3_coder_malformed_and_cut_off_calls_are_errors(text, reason):
    turn = Qwen3CoderParser([WEATHER]).parse(text)
    assert turn.calls == () and len(turn.errors) == 1 and reason in turn.errors[0].reason, turn.errors
    assert "<tool_call>" not in turn.content


def test_qwen3_coder_keeps_good_calls_beside_a_bad_one():
    parser = Qwen3CoderParser([WEATHER])
    turn = parser.parse(qwen_call("get_weather", city="Paris", days="x") + "\n"
                        + qwen_call("get_weather", city="Lima", days="2") + "\n<tool_call>\n<function=get")
    assert [c.arguments["city"] for c in turn.calls] == ["Lima"] and len(turn.errors) == 2


# -- Llama 3 JSON ------------------------------------------------------------------------------------------------

def test_llama3_json_reads_bare_and_tagged_calls():
    parser = Llama3JsonParser()
    bare = parser.parse('{"name": "get_current_conditions", "parameters": {"location": "San Francisco, CA", '
                        '"unit": "Fahrenheit"}}')
    assert bare.content == "" and bare.errors == ()
    assert [(c.name, c.arguments) for c in bare.calls] == [
        ("get_current_conditions", {"location": "San Francisco, CA", "unit": "Fahrenheit"})]
    tagged = parser.parse('Let me look both up.<|python_tag|>{"name": "get_weather", "parameters": {"city": "a;b"}}; '
                          '{"name": "get_time", "arguments": {"timezone": "Europe/Paris"}};')
    assert tagged.content == "Let me look both up." and tagged.errors == ()
    assert [(c.name, c.arguments) for c in tagged.calls] == [
        ("get_weather", {"city": "a;b"}), ("get_time", {"timezone": "Europe/Paris"})]
    assert tagged.calls[1].raw == '{"name": "get_time", "arguments": {"timezone": "Europe/Paris"}}'
    plain = parser.parse("It is 18 degrees in Paris.")
    assert plain.calls == () and plain.errors == () and plain.content == "It is 18 degrees in Paris."


@pytest.mark.parametrize(("text", "calls", "reason"), [
    ('{"name": "get_weather", "parameters": {"city": "Pa', 0, "not valid JSON"),  # cut off
    ('<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "param', 1, "not valid JSON"),
    ('{"name": "get_weather", "parameters": ["Paris"]}', 0, '"parameters" must be a JSON object'),
    ('{"parameters": {"city": "Paris"}}', 0, 'a string "name"'),
    ('{"name": "a", "parameters": {}} and then some text', 1, "calls are separated by ';'"),
    ("<|python_tag|>", 0, "is not followed by a call"),
    ('{"name": "a", "parameters": ' + "[" * 100_000, 0, "nested too deeply"),
])
def test_llama3_json_malformed_and_cut_off_calls_are_errors(text, calls, reason):
    turn = Llama3JsonParser().parse(text)
    assert len(turn.calls) == calls and len(turn.errors) == 1 and reason in turn.errors[0].reason, turn.errors


# -- GPT-OSS harmony ---------------------------------------------------------------------------------------------

HARMONY_CALL = ("<|channel|>analysis<|message|>Need to use function get_weather.<|end|>"
                "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
                '<|message|>{"city":"San Francisco","days":2}<|call|>')


def test_gpt_oss_reads_calls_with_the_recipient_in_either_header():
    parser = GptOssParser()
    turn = parser.parse(HARMONY_CALL)
    assert [(c.name, c.arguments) for c in turn.calls] == [("get_weather", {"city": "San Francisco", "days": 2})]
    assert turn.content == "" and turn.errors == ()  # the reasoning is not content
    raw = turn.calls[0].raw
    assert raw.startswith("<|start|>assistant<|channel|>commentary") and raw.endswith("<|call|>")
    # the recipient in the role header; the loop stripped the <|call|> that ended the turn
    role = parser.parse(' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Tokyo", "days": 1}')
    assert [(c.name, c.arguments) for c in role.calls] == [("get_weather", {"city": "Tokyo", "days": 1})]
    final = parser.parse("<|channel|>analysis<|message|>It is sunny.<|end|><|start|>assistant<|channel|>final"
                         "<|message|>Sunny, 21 °C.<|return|>")
    assert final.calls == () and final.errors == () and final.content == "Sunny, 21 °C."
    preamble = parser.parse("<|channel|>commentary<|message|>Checking the forecast.<|end|><|start|>assistant"
                            "<|channel|>commentary to=functions.get_weather <|constrain|>json"
                            '<|message|>{"city":"Oslo"}')
    assert preamble.content == "Checking the forecast." and len(preamble.calls) == 1
    assert parser.parse("no harmony here").content == "no harmony here"


@pytest.mark.parametrize(("text", "reason"), [
    (HARMONY_CALL[: HARMONY_CALL.index('"days"')], "cut off before its JSON ends"),
    (HARMONY_CALL[: HARMONY_CALL.index("<|message|>{")], "not followed by <|message|>"),
    (HARMONY_CALL.replace('{"city":"San Francisco","days":2}', "city=Paris"), "not valid JSON"),
    (HARMONY_CALL.replace('{"city":"San Francisco","days":2}', "[1]"), '"arguments" must be a JSON object'),
])
def test_gpt_oss_malformed_and_cut_off_calls_are_errors(text, reason):
    turn = GptOssParser().parse(text)
    assert turn.calls == () and len(turn.errors) == 1 and reason in turn.errors[0].reason, turn.errors


# -- settled content (what a streamed turn offered tools sends before it ends) ------------------------------------

HERMES_TURN = ('  Let me add those.\n\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+1"}}\n'
               '</tool_call>')
SETTLED = [
    (HermesParser(), HERMES_TURN, "Let me add those."),
    (HermesParser(), HERMES_TURN + "\nDone, and <tool_call>{bad", "Let me add those."),  # text after, a bad call
    (HermesParser(), "I would write <tool_ca but no call.", "I would write <tool_ca but no call."),
    (HermesParser(), "<tool_call>\n" + '{"name": "calculator", "arguments": {}}\n</tool_call>', ""),
    (Qwen3CoderParser([WEATHER]), "Checking.\n" + qwen_call("get_weather", city="Oslo", days="2"), "Checking."),
    (Llama3JsonParser(), 'Let me look.<|python_tag|>{"name": "a", "parameters": {}}', "Let me look."),
    (Llama3JsonParser(), ' {"name": "a", "parameters": {}}', ""),
    (Llama3JsonParser(), "It is 18 degrees.", "It is 18 degrees."),
    (GptOssParser(), HARMONY_CALL, ""),
]


@pytest.mark.parametrize(("parser", "text", "settled"), SETTLED)
def test_settled_content_grows_with_the_text_and_the_parsed_content_starts_with_it(parser, text, settled):
    """At every point of the turn what may stream is a prefix of what streamed after it and of the parsed content,
    so deltas add up to the reply's content; once whole, as much of the content as the format can tell."""
    content = parser.parse(text).content
    before = ""
    for end in range(len(text) + 1):
        now = parser.settled_content(text[:end])
        assert now.startswith(before) and content.startswith(now), (text[:end], before, now, content)
        before = now
    assert before == settled


# -- choice, stop tokens, grammars -------------------------------------------------------------------------------

def test_the_config_chooses_the_parser_and_refuses_a_grammar_it_lacks(codec):
    assert isinstance(LoopContext(generator=None, codec=codec).parser, HermesParser)
    for name, kind in [("qwen3_coder", Qwen3CoderParser), ("llama3_json", Llama3JsonParser), ("gpt_oss", GptOssParser)]:
        context = LoopContext(generator=None, codec=codec, config=AgentLoopConfig(tool_parser=name))
        assert isinstance(context.parser, kind)
    with pytest.raises(ValueError, match="tool_parser"):
        AgentLoopConfig(tool_parser="pythonic")
    with pytest.raises(ValueError, match="constrain_tool_calls is not available with tool_parser gpt_oss"):
        AgentLoopConfig(tool_parser="gpt_oss", constrain_tool_calls=True)
    with pytest.raises(ValueError, match="gpt_oss has no grammar"):
        GptOssParser().constraint([WEATHER], 1)


def test_format_stop_tokens_join_the_turns_stop_ids_where_the_tokenizer_has_them(codec):
    # SmolLM2's tokenizer has neither <|call|> nor <|eom_id|> as one token: nothing to add, the text still parses
    assert stop_token_ids(GptOssParser(), codec.encode) == () == stop_token_ids(Llama3JsonParser(), codec.encode)
    parser = _HarmonyEndingOnEndOfText()
    assert stop_token_ids(parser, codec.encode) == (0,)
    config = AgentLoopConfig(sampling={"stop_token_ids": [7]}, turn_sampling=[{"temperature": 0.5}])
    context = LoopContext(generator=None, codec=codec, config=config, parser=parser)
    assert context.config.sampling.stop_token_ids == (7, 0) and context.config.turn_sampling[0].stop_token_ids == (0,)


class _HarmonyEndingOnEndOfText(GptOssParser):
    """GPT-OSS's format with ``<|endoftext|>`` (one token of the test tokenizer) standing in for ``<|call|>``."""

    stop_tokens = ("<|endoftext|>",)


def _matcher(codec, grammar: str):
    import xgrammar

    info = xgrammar.TokenizerInfo.from_huggingface(codec.tokenizer, vocab_size=49152)
    compiled = xgrammar.GrammarCompiler(info).compile_grammar(grammar)

    def accepts(text: str) -> bool:
        matcher = xgrammar.GrammarMatcher(compiled)
        return all(matcher.accept_token(t) for t in codec.encode(text)) and matcher.accept_token(EOS)

    return accepts


def test_qwen3_coder_grammar_types_each_parameter(codec):
    pytest.importorskip("xgrammar")
    calc = FunctionTool(calculator).spec.openai()
    accepts = _matcher(codec, Qwen3CoderParser().constraint([WEATHER, calc], max_calls=2))
    one = qwen_call("get_weather", city="San Francisco", days="3", unit="celsius", hours="[9, 12]")
    assert accepts(one) and accepts(one + "\n" + qwen_call("calculator", expression="(1 + 2) * 3"))
    assert accepts(qwen_call("get_weather", city="a < b, x<<y\nz", days="-1"))  # optional ones left out
    assert not accepts("\n".join([one] * 3))  # max_calls
    assert not accepts(qwen_call("get_weather", city="Paris", days="three"))  # an integer
    assert not accepts(qwen_call("get_weather", city="Paris", days="1", unit="kelvin"))  # the enum
    assert not accepts(qwen_call("get_weather", city="Paris"))  # a required parameter
    assert not accepts(qwen_call("get_weather", days="1", city="Paris"))  # the schema's order
    assert not accepts(qwen_call("calculator", expression="2+x"))  # the parameter's pattern
    assert not accepts(qwen_call("shell", command="ls"))  # only offered tools
    assert not accepts(qwen_call("get_weather", city="</parameter>", days="1"))  # a value cannot close its tag
    # what the grammar accepts, the parser reads
    assert Qwen3CoderParser([WEATHER]).parse(one).calls[0].arguments == {
        "city": "San Francisco", "days": 3, "unit": "celsius", "hours": [9, 12]}


def test_llama3_json_grammar(codec):
    pytest.importorskip("xgrammar")
    accepts = _matcher(codec, Llama3JsonParser().constraint([WEATHER, WRITE], max_calls=2))
    one = '{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}'
    two = '{"name": "write_file", "parameters": {"path": "a.md", "content": "x"}}'
    assert accepts(one) and accepts(one + "; " + two)
    assert not accepts("; ".join([one, two, one]))  # max_calls
    assert not accepts(one.replace('"days": 2', '"days": "2"'))  # the tool's schema
    assert not accepts(one.replace("get_weather", "shell"))
    assert not accepts("It is sunny.")
    turn = Llama3JsonParser().parse(one + "; " + two)
    assert [c.name for c in turn.calls] == ["get_weather", "write_file"]
    with pytest.raises(ValueError, match="at least one tool"):
        make_parser("llama3_json").constraint([], 1)


# -- one tool-loop run per format --------------------------------------------------------------------------------

@pytest.mark.parametrize(("tool_parser", "reply"), [
    ("qwen3_coder", "Let me compute it.\n" + qwen_call("calculator", expression="2+3")),
    ("llama3_json", '<|python_tag|>{"name": "calculator", "parameters": {"expression": "2+3"}}'),
    ("gpt_oss", "<|channel|>analysis<|message|>Use the calculator.<|end|><|start|>assistant<|channel|>commentary "
                'to=functions.calculator <|constrain|>json<|message|>{"expression": "2+3"}<|call|>'),
])
async def test_the_tool_loop_runs_each_formats_calls_token_exact(codec, tool_parser, reply):
    replies = [reply, "The answer is 5."]
    async with loop_context(codec, replies, AgentLoopConfig(tool_parser=tool_parser)) as (_, loops, _s):
        t = await loops.get("tool").run(Sample(sample_id="s1", messages=QUESTION, tools=("calculator",)))
    assert t.termination is Termination.NO_TOOL_CALL and t.error is None
    assert t.tool_calls == 1 and t.tool_errors == 0 and t.malformed_tool_calls == 0
    assert t.messages[-3]["tool_calls"][0]["function"] == {"name": "calculator", "arguments": {"expression": "2+3"}}
    assert t.messages[-2] == {"role": "tool", "name": "calculator", "content": "5"}
    runs = segments(t.response_mask)
    assert [r[0] for r in runs] == [1, 0, 1]
    assert list(t.response_ids[runs[0][1] : runs[0][2]]) == codec.encode(reply) + [EOS]
    assert list(t.response_ids[runs[2][1] : runs[2][2]]) == codec.encode(replies[1]) + [EOS]
    assert codec.decode(t.response_ids[runs[1][1] : runs[1][2]]).startswith("\n<|im_start|>user\n<tool_response>\n5\n")
    assert t.drift is None


async def test_a_formats_stop_token_ends_the_turn_and_its_callsegments(codec):
    """The engine stops on the format's call-ending token (here one the test tokenizer has); the loop keeps the
    token in the ids, parses the call without it, and answers it."""
    reply = ('<|channel|>commentary to=functions.calculator <|constrain|>json<|message|>{"expression": "2+3"}'
             "<|endoftext|>ignored")
    parser = _HarmonyEndingOnEndOfText()
    async with loop_context(codec, [reply, "5"], parser=parser) as (_ctx, loops, script):
        t = await loops.get("tool").run(Sample(sample_id="s1", messages=QUESTION, tools=("calculator",)))
    assert script.requests[0].sampling.stop_token_ids == (0,)
    assert t.tool_calls == 1 and t.tool_errors == 0 and t.messages[-2]["content"] == "5"
    runs = segments(t.response_mask)
    first = codec.encode(reply[: reply.index("<|endoftext|>")]) + [0]
    assert list(t.response_ids[runs[0][1] : runs[0][2]]) == first  # what the model produced, stop token included
    # the template closes the turn with its own end of turn after the model's stop token: the drift check says so
    assert t.drift is not None and t.drift.position == len(t.prompt_ids) + len(first) - 1
