"""verl's own agent loops (single-turn, tool), unchanged, send pictures through ``AgentloopLLMClient``: each picture
reaches the engine as ``GenerateRequest.media`` with its span in the ids verl's processor expanded (found with the
tiny VLM's processor, tiny_vlm.py); prompts and pictures that disagree, videos, audio and a client without a
processor for pictures are refused by name.

Mostly the engine is the fake (it takes any span and mixes the pictures' bytes into its stream); the spans are
checked here against the tiny VLM's layout of one picture (an opener, ``IMAGE_SEQ_LEN`` ``<image>`` ids, a closer).
Once, verl's tool loop answers a tool's picture on the embedded engine serving the tiny VLM, which checks each span
against its own processor's expansion and runs the model on the picture. The pictures mean nothing to the model
(its vision part is random): only where they sit, which bytes arrive and that the model ran on them matter.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("verl", reason="verl is not installed (make setup installs it)")

from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop
from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
from verl.utils.dataset.rl_dataset import RLHFDataset
from verl.workers.rollout.llm_server import LLMServerClient

from agentloop_grpc.common import model_store
from agentloop_grpc.common.media import ImageExpander, MediaInput, decode_image, encode_png
from agentloop_grpc.common.types import SamplingParams
from agentloop_grpc.engine_adapters.factory import make_adapter
from agentloop_grpc.engine_adapters.server import create_server, start_adapter
from agentloop_grpc.integrations.verl.client import AgentloopLLMClient
from agentloop_grpc.integrations.verl.picture_spans import PictureSpans
from agentloop_grpc.router import GenerateCall, Router

from .tiny_vlm import IMAGE_SEQ_LEN

ROLLOUT = {"prompt_length": 256, "response_length": 128, "full_determinism": False,
           "multi_turn": {"max_user_turns": 2, "max_assistant_turns": 3, "max_parallel_calls": 1,
                          "max_tool_response_length": 256, "tool_response_truncate_side": "middle",
                          "format": "hermes"}}
CONFIG = OmegaConf.create({"actor_rollout_ref": {"rollout": ROLLOUT}})
GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "logprobs": True, "max_tokens": 40}
LOOK = {"type": "function", "function": {
    "name": "look", "description": "Take a picture of the scene.",
    "parameters": {"type": "object", "properties": {}, "required": []},
}}
CALL = '<tool_call>\n{"name": "look", "arguments": {}}\n</tool_call>'


def _picture(colour: tuple[int, int, int], size: tuple[int, int] = (40, 30)):
    from PIL import Image

    return Image.new("RGB", size, colour)


RED, BLUE = _picture((200, 10, 10)), _picture((10, 10, 200), (24, 48))


class PictureDataset(RLHFDataset):
    """verl's dataset class with its pictures read from the messages' image parts as they are (verl's own reads
    them with qwen_vl_utils, which is not installed here); verl loops take a dataset class by config."""

    @classmethod
    async def process_multi_modal_info(cls, messages, image_patch_size=14, config=None):
        pictures = [part["image"] for message in messages if isinstance(message["content"], list)
                    for part in message["content"] if part["type"] == "image"]
        return pictures or None, None, None


class LookTool(BaseTool):
    """A verl tool answering with a picture and a caption, as a screenshot tool would."""

    async def execute(self, instance_id, parameters, **kwargs):
        return ToolResponse(image=[BLUE], text="the scene"), 0.0, {}


@pytest.fixture(scope="module")
def processor(tiny_vlm):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(tiny_vlm)


def _span(processor) -> list[int]:
    """One picture's ids in the tiny VLM's layout, from its token names (not from the client's expander)."""
    names = ["<fake_token_around_image>", "<global-img>", *["<image>"] * IMAGE_SEQ_LEN, "<fake_token_around_image>"]
    return processor.tokenizer.convert_tokens_to_ids(names)


def _starts(ids: list[int], span: list[int]) -> list[int]:
    return [i for i in range(len(ids)) if ids[i:i + len(span)] == span]


def _recorded(seen: list, answer: Callable[[Any], list[int]]) -> Callable[[Any], list[int]]:
    """A fake engine's script that keeps each request it answers."""

    def script(request: Any) -> list[int]:
        seen.append(request)
        return answer(request)

    return script


async def _fake(script=None):
    server = await create_server(make_adapter("fake", {"vocab_size": 50_000, "script": script}), "127.0.0.1:0")
    await start_adapter(server)
    return server, f"127.0.0.1:{server.port}"


def _pixels(item) -> bytes:
    return decode_image(item.data, item.mime_type).tobytes()


async def test_verls_single_turn_loop_sends_its_picture_at_the_span_its_processor_expanded(tiny_vlm, processor):
    seen: list = []
    server, address = await _fake(_recorded(seen, lambda request: [5, 6, 7]))
    client = AgentloopLLMClient(CONFIG, servers=[address], model_path=str(tiny_vlm))
    try:
        loop = SingleTurnAgentLoop(
            trainer_config=DictConfigWrap(CONFIG), server_manager=client, tokenizer=processor.tokenizer,
            processor=processor, dataset_cls=PictureDataset, data_config=DictConfigWrap(OmegaConf.create({})),
            hf_model_type="idefics3",
        )
        messages = [{"role": "user", "content": [{"type": "image", "image": RED},
                                                 {"type": "text", "text": "What colour is it?"}]}]
        output = await loop.run(dict(GREEDY), raw_prompt=messages)
    finally:
        await client.close()
        await server.stop(grace_s=1)
    (request,) = seen
    assert request.prompt_ids.tolist() == output.prompt_ids  # verl's expanded ids, sent as they are
    (item,) = request.media
    assert [item.offset] == _starts(output.prompt_ids, _span(processor)) and item.length == len(_span(processor))
    assert item.mime_type == "image/png" and _pixels(item) == RED.tobytes()
    assert output.response_ids[:3] == [5, 6, 7] and output.multi_modal_data["images"] == [RED]


async def test_verls_tool_loop_sends_the_tools_picture_with_the_next_turn(tiny_vlm, processor):
    call_ids = processor.tokenizer.encode(CALL, add_special_tokens=False)
    seen: list = []
    server, address = await _fake(_recorded(seen, lambda request: call_ids if not request.media else [5]))
    client = AgentloopLLMClient(CONFIG, servers=[address], model_path=str(tiny_vlm))
    try:
        loop = ToolAgentLoop(
            trainer_config=DictConfigWrap(CONFIG), server_manager=client, tokenizer=processor.tokenizer,
            processor=processor, dataset_cls=PictureDataset, data_config=DictConfigWrap(OmegaConf.create({})),
            hf_model_type="idefics3", tools=ToolListWrap([LookTool({}, OpenAIFunctionToolSchema.model_validate(LOOK))]),
        )
        output = await loop.run(dict(GREEDY), raw_prompt=[{"role": "user", "content": "Look, then say what you see."}])
    finally:
        await client.close()
        await server.stop(grace_s=1)
    first, second = seen
    assert not first.media and len(second.prompt_ids) > len(first.prompt_ids)
    (item,) = second.media  # the tool's picture, in the tool's response, after the first turn
    ids = second.prompt_ids.tolist()
    assert [item.offset] == _starts(ids, _span(processor)) and item.offset > len(first.prompt_ids)
    assert _pixels(item) == BLUE.tobytes()
    # verl's record of it: the picture's span is part of the tool response (mask 0), the model's turns mask 1
    response = output.response_ids
    assert response[:len(call_ids) + 1] == [*call_ids, processor.tokenizer.eos_token_id]  # the engine's turn
    start = item.offset - len(output.prompt_ids)
    end = start + item.length
    assert response[start:end] == _span(processor) and not any(output.response_mask[start:end])
    assert output.multi_modal_data["images"] == [BLUE] and output.response_mask[-2:] == [1, 1]  # 5 and eos


async def test_the_engines_tokens_depend_on_the_picture_and_bytes_go_as_they_are(tiny_vlm, processor):
    seen: list = []
    server, address = await _fake()
    recorder, recorder_address = await _fake(_recorded(seen, lambda request: [5]))
    text = processor.tokenizer.encode("Say what you see:", add_special_tokens=False)
    prompt = [*text, *_span(processor), *text]
    jpeg = io.BytesIO()
    RED.save(jpeg, format="JPEG")
    client = AgentloopLLMClient(CONFIG, servers=[address], model_path=str(tiny_vlm))
    recording = AgentloopLLMClient(CONFIG, servers=[recorder_address], model_path=str(tiny_vlm))
    try:
        outputs = [(await client.generate("r", prompt_ids=prompt, sampling_params=GREEDY, image_data=p)).token_ids
                   for p in ([RED], [BLUE], RED)]  # a picture alone, as verl's servers take it too
        await recording.generate("r", prompt_ids=prompt, sampling_params=GREEDY, image_data=[jpeg.getvalue()])
        copy = pickle.loads(pickle.dumps(client))  # verl hands its client to Ray workers: the processor reloads there
        again = (await copy.generate("r", prompt_ids=prompt, sampling_params=GREEDY, image_data=[RED])).token_ids
        await copy.close()
    finally:
        await client.close()
        await recording.close()
        await server.stop(grace_s=1)
        await recorder.stop(grace_s=1)
    assert outputs[0] != outputs[1] and outputs[0] == outputs[2] == again  # greedy: the same picture, the same tokens
    (item,) = seen[0].media
    assert (item.mime_type, item.data, item.offset) == ("image/jpeg", jpeg.getvalue(), len(text))


class FirstTurnElsewhere(LLMServerClient):
    """verl's client for one trajectory whose first turn goes to ``first`` (the fake: SmolLM2 calls no tool by
    itself) and every later one to ``rest`` with a budget of ``LATER_TOKENS`` (two CPU cores), each call otherwise
    passed on as verl made it."""

    LATER_TOKENS = 4

    def __init__(self, config, first: AgentloopLLMClient, rest: AgentloopLLMClient) -> None:
        super().__init__(config)
        self.first, self.rest, self.calls = first, rest, 0

    async def generate(self, request_id, *, sampling_params, **kwargs):
        self.calls += 1
        if self.calls == 1:
            return await self.first.generate(request_id, sampling_params=sampling_params, **kwargs)
        budget = {**sampling_params, "max_tokens": self.LATER_TOKENS}
        return await self.rest.generate(request_id, sampling_params=budget, **kwargs)


@pytest.mark.slow
async def test_verls_tool_loop_answers_the_tools_picture_on_the_embedded_vlm(tiny_vlm, processor):
    from agentloop_grpc.engine_adapters.embedded import EmbeddedEngine, EmbeddedEngineConfig

    call_ids = processor.tokenizer.encode(CALL, add_special_tokens=False)
    fake, fake_address = await _fake(lambda request: call_ids)
    embedded = await create_server(EmbeddedEngine(EmbeddedEngineConfig(model=str(tiny_vlm), max_model_len=512)),
                                   "127.0.0.1:0")
    await start_adapter(embedded)
    address = f"127.0.0.1:{embedded.port}"
    first = AgentloopLLMClient(CONFIG, servers=[fake_address], model_path=str(tiny_vlm))
    rest = AgentloopLLMClient(CONFIG, servers=[address], model_path=str(tiny_vlm))
    try:
        loop = ToolAgentLoop(
            trainer_config=DictConfigWrap(CONFIG), server_manager=FirstTurnElsewhere(CONFIG, first, rest),
            tokenizer=processor.tokenizer, processor=processor, dataset_cls=PictureDataset,
            data_config=DictConfigWrap(OmegaConf.create({})), hf_model_type="idefics3",
            tools=ToolListWrap([LookTool({}, OpenAIFunctionToolSchema.model_validate(LOOK))]),
        )
        output = await loop.run(dict(GREEDY), raw_prompt=[{"role": "user", "content": "Look."}])
        context = output.prompt_ids + output.response_ids
        answer = len(output.prompt_ids) + output.response_mask.index(1, len(call_ids) + 1)  # the model's 2nd turn
        (start,) = _starts(context, _span(processor))
        async with Router([address]) as router:  # the same context straight to the engine, each picture's media
            direct = {name: await router.generate(GenerateCall(
                "direct", context[:answer], SamplingParams(max_new_tokens=tokens, temperature=0.0, logprobs=True),
                media=[MediaInput("image/png", encode_png(picture), start, len(_span(processor)))]))
                for name, picture, tokens in (("blue", BLUE, FirstTurnElsewhere.LATER_TOKENS), ("red", RED, 1))}
    finally:
        await first.close()
        await rest.close()
        await fake.stop(grace_s=1)
        await embedded.stop(grace_s=1)
    turn = slice(answer - len(output.prompt_ids), None)
    assert output.response_ids[turn] == list(direct["blue"].token_ids) and direct["blue"].prompt_images == 1
    assert output.response_logprobs[turn] == pytest.approx(list(direct["blue"].logprobs), abs=1e-5)
    # the model ran on the tool's picture: another picture at the same span gives other logprobs
    assert direct["red"].logprobs[0] != pytest.approx(direct["blue"].logprobs[0], abs=1e-4)


def test_a_pictures_expansion_is_computed_once_for_the_turns_that_resend_it(processor):
    expanded = []

    class Counting(ImageExpander):
        def expand(self, image):
            expanded.append(image.size)
            return super().expand(image)

    spans = PictureSpans(Counting(processor))
    text = processor.tokenizer.encode("Look:", add_special_tokens=False)
    one = [*text, *_span(processor)]
    two = [*one, *text, *_span(processor)]
    first = spans.media(one, [RED])
    assert spans.media(two, [RED, BLUE])[0] == first[0]  # verl's tool loop resends every picture each turn
    assert [m.offset for m in spans.media(two, [RED, BLUE])] == [len(text), 2 * len(text) + len(_span(processor))]
    assert expanded == [RED.size, BLUE.size]  # once per picture, however many turns resend it


def _client(path=None) -> AgentloopLLMClient:
    return AgentloopLLMClient(CONFIG, servers=["127.0.0.1:1"], model_path=path)  # refused before any server call


@pytest.mark.parametrize(("pictures", "spans", "needle"), [
    (2, 1, r"image_data\[1\]: the processor's expansion of this picture \(19 ids\) is not in prompt_ids after "
           r"position {after}: the prompt shows fewer pictures than image_data's 2"),
    (1, 2, r"prompt_ids hold the image placeholder '<image>' \(id 49153\) at position {stray}, outside the spans of "
           r"image_data's 1 picture\(s\): the prompt shows more pictures than image_data carries"),
])
async def test_a_prompt_showing_another_number_of_pictures_than_image_data_is_refused(
        tiny_vlm, processor, pictures, spans, needle):
    text = processor.tokenizer.encode("Compare:", add_special_tokens=False)
    prompt = [*text, *(_span(processor) * spans), *text]
    after = len(text) + len(_span(processor))  # the end of the first picture's span
    with pytest.raises(ValueError, match=needle.format(after=after, stray=after + 2)):  # past the second's opener
        await _client(str(tiny_vlm)).generate("r", prompt_ids=prompt, sampling_params={},
                                              image_data=[RED, BLUE][:pictures])


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"video_data": [("frames", {})]}, r"\['video_data'\]: agentloop.v1 carries pictures only"),
    ({"audio_data": [b"wave"]}, r"\['audio_data'\]: agentloop.v1 carries pictures only"),
    ({"image_data": [RED], "mm_processor_kwargs": {"max_pixels": 64}},
     r"mm_processor_kwargs \['max_pixels'\]: agentloop.v1 carries no processor arguments"),
    ({"image_data": ["/tmp/picture.png"]}, r"image_data\[0\] is a str: pictures are PIL images or the bytes"),
    ({"image_data": [b"not a picture"]}, r"image_data\[0\]: the data does not decode as an image"),
])
async def test_what_agentloop_v1_does_not_carry_is_refused_by_name(tiny_vlm, processor, kwargs, needle):
    prompt = [*processor.tokenizer.encode("Hi", add_special_tokens=False), *_span(processor)]
    with pytest.raises(ValueError, match=needle):
        await _client(str(tiny_vlm)).generate("r", prompt_ids=prompt, sampling_params={}, **kwargs)


@pytest.mark.parametrize(("path", "needle"), [
    (model_store.prepare, r"image_data: .* the model at .* has no processor that takes images"),
    (lambda: None, r"image_data: .* no model path was given \(give AgentloopLLMClient model_path="),
])
async def test_a_client_without_a_processor_for_pictures_says_so(path, needle):
    with pytest.raises(ValueError, match=needle):
        await _client(path() and str(path())).generate("r", prompt_ids=[1, 2], sampling_params={}, image_data=[RED])
