"""Images through the agent loop against the fake engine (a real gRPC server, scripted replies): the tool's picture
as one template delta with its span, mask 0 on it, on the wire with every later generation, in the trajectory, in
Parquet, in the trainer batches (ours and verl's); pictures in dataset rows (paths, data URLs, bytes); bad
pictures fail their sample alone. The fake reads no pixels; the embedded and vLLM tests run the real model."""

from __future__ import annotations

import base64
import json
from contextlib import asynccontextmanager

import pytest

from agentloop_grpc.agent import (
    AgentLoopConfig,
    AgentLoopWorker,
    LoopContext,
    LoopRegistry,
    Sample,
    Termination,
    read_parquet,
    to_batch,
    write_parquet,
)
from agentloop_grpc.agent.spec import load_codec
from agentloop_grpc.common.media import decode_image
from agentloop_grpc.engine_adapters.fake import FakeEngine
from agentloop_grpc.engine_adapters.fake_config import FakeEngineConfig
from agentloop_grpc.engine_adapters.server import create_server, start_adapter
from agentloop_grpc.rollout.config import Dataset
from agentloop_grpc.rollout.dataset import read_rows, to_samples
from agentloop_grpc.router import Router, RouterConfig

from .image_loop import DRAW_CALL, check_image_trajectory, run_image_loop
from .pictures import png

EOS = 2  # <|im_end|>
VOCAB = 49_192  # SmolLM2's and the 40 tokens Idefics3 adds
RED, BLUE = png((255, 0, 0)), png((0, 0, 255))


@pytest.fixture(scope="module")
def codec(tiny_vlm):
    return load_codec(str(tiny_vlm))


@asynccontextmanager
async def fake_engine(codec, replies):
    """A fake engine whose i-th assistant turn of a conversation is ``replies[i]`` (the last repeats)."""
    def script(request):
        turn = codec.decode(request.prompt_ids).count("<|im_start|>assistant") - 1
        return codec.encode(replies[min(turn, len(replies) - 1)])

    server = await create_server(FakeEngine(FakeEngineConfig(vocab_size=VOCAB, eos_token_id=EOS, script=script)),
                                 "127.0.0.1:0")
    await start_adapter(server)
    try:
        yield f"127.0.0.1:{server.port}"
    finally:
        await server.stop(grace_s=1)


@pytest.fixture(scope="module")
async def drawn(codec):
    """One two-turn run: the model calls draw, then answers with the picture in its prompt."""
    async with fake_engine(codec, [DRAW_CALL, "I see a square."]) as address:
        return await run_image_loop(address, codec)


def test_the_tools_picture_is_one_masked_delta_sent_with_the_next_turn(drawn, codec):
    t, recorded = drawn
    image = check_image_trajectory(t, recorded, codec)
    assert decode_image(image.data, image.mime_type).getpixel((0, 0)) == (255, 0, 0)
    assert t.messages[-1] == {"role": "assistant", "content": "I see a square."}
    assert t.termination is Termination.NO_TOOL_CALL


async def test_a_tool_image_that_does_not_decode_is_a_tool_error(codec):
    plot = '<tool_call>\n{"name": "plot", "arguments": {"title": "loss"}}\n</tool_call>'
    sample = Sample(sample_id="plot", messages=({"role": "user", "content": "Plot the loss."},), tools=("plot",))
    async with fake_engine(codec, [plot, "No picture."]) as address:
        t, recorded = await run_image_loop(address, codec, sample=sample)
    assert t.error is None and t.tool_errors == 1 and t.media == ()
    assert t.messages[2]["content"].startswith("Error (invalid image): the data does not decode as an image")
    assert [list(c.media) for c in recorded.calls] == [[], []]


def test_parquet_keeps_the_pictures(drawn, tmp_path):
    t, _ = drawn
    [back] = read_parquet(write_parquet([t], tmp_path / "t.parquet"))
    assert back.media == t.media and back.messages == t.messages and back.response_ids == t.response_ids


def test_batches_carry_the_pictures_at_their_place(drawn, codec):
    from verl.utils.model import extract_multi_modal_inputs

    from agentloop_grpc.integrations.verl.batch import to_dataproto

    t, _ = drawn
    text_only = without_pictures(t)
    batch = to_batch([t, text_only], pad_token_id=EOS)
    [image] = batch.media[0]
    assert batch.media[1] == ()
    expansion = codec.images.expand(decode_image(image.data, image.mime_type))
    assert tuple(batch.tensors["input_ids"][0, image.offset : image.end].tolist()) == expansion.ids
    data = to_dataproto([t, text_only, t], pad_token_id=EOS, images=codec.images)
    rows = list(data.non_tensor_batch["multi_modal_inputs"])
    assert rows[1] == {}
    assert set(rows[0]) == set(expansion.inputs) == {"pixel_values", "pixel_attention_mask"}
    assert rows[0]["pixel_values"].numpy().tolist() == expansion.inputs["pixel_values"].tolist()
    merged = extract_multi_modal_inputs(rows)  # what verl's trainer does with the column
    assert merged["pixel_values"].shape[0] == 2
    with pytest.raises(ValueError, match="image processor"):
        to_dataproto([t], pad_token_id=EOS)


def without_pictures(t):
    """A trajectory of the same shape without pictures, for mixed batches."""
    import dataclasses

    return dataclasses.replace(t, sample_id="text", media=(), messages=())


@pytest.fixture(scope="module")
async def looping(codec):
    """Samples run through a worker on a fake engine that answers without tools."""
    @asynccontextmanager
    async def run():
        async with fake_engine(codec, ["Fine."]) as address, Router([address], RouterConfig(no_server_wait_s=5)) as r:
            await r.fleet.wait_ready()
            context = LoopContext(generator=r, codec=codec, config=AgentLoopConfig())
            yield AgentLoopWorker(LoopRegistry.default(context))
    return run


def _user(*parts):
    return {"role": "user", "content": list(parts)}


def _image(value):
    return {"type": "image", "image": value}


async def test_dataset_pictures_by_path_data_url_and_bytes(looping, codec, tmp_path):
    (tmp_path / "pics").mkdir()
    (tmp_path / "pics" / "red.png").write_bytes(RED)
    url = "data:image/png;base64," + base64.b64encode(BLUE).decode()
    rows = [{"id": "path", "messages": [_user({"type": "text", "text": "Look: "}, _image("pics/red.png"))]},
            {"id": "url", "messages": [_user(_image(url), {"type": "text", "text": "and "}, _image("pics/red.png"))]}]
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows))
    parquet_rows = [{"id": "bytes", "messages": [_user({"type": "text", "text": "Look: "}, _image(BLUE))]}]
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(parquet_rows), tmp_path / "rows.parquet")
    samples = []
    for path in (jsonl, tmp_path / "rows.parquet"):
        dataset = Dataset(path=str(path))
        samples += to_samples(read_rows(dataset), dataset, 1)
    async with looping() as worker:
        done = await worker.run(samples)
    assert [t.error for t in done] == [None, None, None]
    assert [[m.data for m in t.media] for t in done] == [[RED], [BLUE, RED], [BLUE]]
    for t in done:  # each picture's span, in the prompt, holds the processor's expansion
        for m in t.media:
            assert t.prompt_ids[m.offset : m.end] == codec.images.expand(decode_image(m.data, m.mime_type)).ids
        assert t.drift is None
    assert done[1].messages[0]["content"] == [{"type": "image", "media": 0}, {"type": "text", "text": "and "},
                                              {"type": "image", "media": 1}]


async def test_a_bad_picture_fails_its_sample_alone(looping, codec, tmp_path):
    samples = [Sample(sample_id=name, messages=(message,)) for name, message in [
        ("good", _user({"type": "text", "text": "Look: "}, _image(RED))),
        ("broken", _user({"type": "text", "text": "Look: "}, _image(b"\x89PNG\r\n\x1a\nnot really"))),
        ("missing", _user(_image(str(tmp_path / "nowhere.png")))),
        ("typed", _user({"type": "text", "text": "a literal <image> in text "}, _image(RED))),
        ("mislabelled", _user(_image("data:image/jpeg;base64," + base64.b64encode(RED).decode()))),
        ("huge", _user(_image(RED + bytes(8 * 1024 * 1024)))),
    ]]
    async with looping() as worker:
        good, broken, missing, typed, mislabelled, huge = await worker.run(samples)
    assert huge.failed and f"more than {8 * 1024 * 1024} (8 MiB)" in huge.error
    assert mislabelled.failed and "content[0]: the data is image/png, not image/jpeg" in mislabelled.error
    assert good.error is None and len(good.media) == 1
    assert broken.failed and "messages[0].content[1]: the data does not decode as an image" in broken.error
    assert missing.failed and "messages[0].content[0]: no image file" in missing.error
    assert typed.failed and "2 image placeholders for 1 images" in typed.error
    # the failed records hold no picture bytes, only what a reader can use (a path)
    assert broken.messages[0]["content"][1] == {"type": "image"}
    assert missing.messages[0]["content"][0] == {"type": "image", "image": str(tmp_path / "nowhere.png")}


def test_a_text_only_model_refuses_pictures():
    from agentloop_grpc.agent.images import read_images
    from agentloop_grpc.common.media import ImageError

    text = load_codec(None)
    rendered, pictures = read_images([_user({"type": "text", "text": "Look: "}, _image(RED))])
    assert text.images is None
    with pytest.raises(ImageError, match="no image processor"):
        text.prompt(rendered, None, pictures)
    # text parts alone render as one string, as the text-only template always did
    rendered, _ = read_images([_user({"type": "text", "text": "Look"}, {"type": "text", "text": " here"})])
    assert text.prompt(rendered, None).ids == text.prompt_ids([{"role": "user", "content": "Look here"}], None)


def test_drift_with_pictures_tells_a_token_split_from_other_text(codec):
    """The fresh render's text once held the image token where the recorded ids decode to its expansion, so a
    harmless split of the model's text after a picture was reported as text drift."""
    from agentloop_grpc.agent.images import read_images

    rendered, pictures = read_images([_user({"type": "text", "text": "Look: "}, _image(RED))])
    prompt = codec.prompt(rendered, None, pictures).ids
    messages = [*rendered, {"role": "assistant", "content": "It is red."}]
    split = [i for ch in "It is red." for i in codec.encode(ch)] + [EOS]  # same text, other tokens
    drift = codec.first_drift(messages, None, prompt + split, False, pictures)
    assert drift is not None and drift.kind == "tokenization" and drift.position == len(prompt)
    other = codec.encode("It is blue.") + [EOS]
    assert codec.first_drift(messages, None, prompt + other, False, pictures).kind == "text"


def test_a_trajectory_refuses_spans_it_cannot_hold(drawn):
    import dataclasses

    t, _ = drawn
    image = t.media[0]
    model_token = len(t.prompt_ids) + t.response_mask.index(1)
    with pytest.raises(ValueError, match=r"media\[0\]'s span holds model tokens"):
        dataclasses.replace(t, media=(image.moved(model_token),))
    with pytest.raises(ValueError, match=r"media\[0\]: the span .* ends past the prompt"):
        dataclasses.replace(t, media=(image.moved(len(t.prompt_ids) + len(t.response_ids) - 1),))


def test_the_vlm_template_renders_text_as_the_text_model_does(codec):
    """tiny_vlm.py's template adds content parts to the text model's; string content renders the same."""
    conversation = [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Draw."},
        {"role": "assistant", "content": "",
         "tool_calls": [{"function": {"name": "draw", "arguments": {"colour": "red"}}}]},
        {"role": "tool", "name": "draw", "content": "done"}, {"role": "assistant", "content": "Done."},
    ]
    tools = [{"type": "function", "function": {"name": "draw", "description": "d", "parameters": {}}}]
    text = load_codec(None)
    for messages in (conversation, conversation[1:]):
        assert codec.render(messages, tools, add_generation_prompt=True) == text.render(messages, tools,
                                                                                       add_generation_prompt=True)
