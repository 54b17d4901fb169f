"""The embedded engine serves the tiny vision-language model (tiny_vlm.py) over a real gRPC server: what it generates
with images equals what transformers computes with the processor's pixel values, the prefix cache never mixes
pictures, and a span that is not the model's expansion is refused.

The pictures mean nothing to this model (its vision encoder and connector are random), but their pixels change the
features and so the logprobs, which is what these tests check.
"""

from __future__ import annotations

import grpc
import pytest

from agentloop_grpc.v1 import engine_pb2, engine_pb2_grpc, generation_pb2, generation_pb2_grpc

from .pictures import picture, png

pytestmark = pytest.mark.slow

RED, BLUE, GREEN = png((255, 0, 0)), png((0, 0, 255)), png((0, 160, 0), (30, 50))
#: The prefix-cache block (the engine's default) and a prefill chunk that splits every image's span.
BLOCK = 16
CHUNK = 4


@pytest.fixture(scope="module")
async def server(tiny_vlm):
    from agentloop_grpc.engine_adapters.embedded import EmbeddedEngine, EmbeddedEngineConfig
    from agentloop_grpc.engine_adapters.server import create_server, start_adapter

    config = EmbeddedEngineConfig(model=str(tiny_vlm), max_running=4, max_model_len=512, prefill_chunk=CHUNK)
    server = await create_server(EmbeddedEngine(config), "127.0.0.1:0")
    await start_adapter(server)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
    yield generation_pb2_grpc.TokenGenerateStub(channel), engine_pb2_grpc.EngineControlStub(channel)
    await channel.close()
    await server.stop(grace_s=1)


@pytest.fixture(scope="module")
def reference(tiny_vlm_reference):
    return tiny_vlm_reference



def _prompt(processor, text: str, pictures: list[bytes]) -> tuple[list[int], list[generation_pb2.MediaInput], dict]:
    """The processor's ids for ``text`` (one ``<image>`` per picture), the pictures' spans in them, and its pixel
    tensors: what a client sends and what transformers computes with."""
    inputs = processor(text=text, images=[[picture(p) for p in pictures]] if pictures else None, return_tensors="pt")
    ids = inputs.pop("input_ids")[0].tolist()
    inputs.pop("attention_mask")
    opener, image = processor.tokenizer.convert_tokens_to_ids(["<fake_token_around_image>", "<global-img>"])
    starts = [i for i in range(len(ids) - 1) if ids[i : i + 2] == [opener, image]]
    span = 3 + processor.image_seq_len
    media = [generation_pb2.MediaInput(mime_type="image/png", data=p, offset=s, length=span)
             for p, s in zip(pictures, starts, strict=True)]
    return ids, media, dict(inputs)


def _text(question: str, images: int = 1, system: str = "") -> str:
    return f"{system}<|im_start|>user\n{'<image>' * images}{question}<|im_end|>\n<|im_start|>assistant\n"


_ids = iter(range(1 << 30))


async def _generate(stubs, ids, media=(), tokens: int = 6):
    """(generated ids, their logprobs, the completion) of a greedy Generate."""
    request = generation_pb2.GenerateRequest(
        request_id=f"mm-{next(_ids)}", prompt_ids=ids, media=list(media),
        sampling_params=generation_pb2.SamplingParams(temperature=0.0, max_new_tokens=tokens, ignore_eos=True,
                                                      logprobs=True),
    )
    messages = [m async for m in stubs[0].Generate(request, timeout=120)]
    chunks = [m.chunk for m in messages[:-1]]
    complete = messages[-1].complete
    out = [t for c in chunks for t in c.token_ids] + list(complete.tokens.token_ids)
    logprobs = [lp for c in chunks for lp in c.logprobs] + list(complete.tokens.logprobs)
    return out, logprobs, complete


def _recompute(model, ids: list[int], out: list[int], pixels: dict):
    """Log-softmax of the reference at each generated position (one forward over prompt + output)."""
    import torch

    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids + out[:-1]]), **pixels).logits[0, len(ids) - 1 :]
    return torch.log_softmax(logits.float(), dim=-1)


def _assert_matches(expected, out: list[int], logprobs: list[float]) -> None:
    import torch

    assert out == expected.argmax(dim=-1).tolist()  # greedy: the recompute's argmax, token for token
    chosen = expected[torch.arange(len(out)), torch.tensor(out)]
    assert logprobs == pytest.approx(chosen.tolist(), abs=1e-4)


def test_the_model_check_accepts_the_checkpoint(tiny_vlm):
    from agentloop_grpc.engine_adapters.embedded import EmbeddedEngineConfig
    from agentloop_grpc.engine_adapters.model_check import check_model

    check_model(EmbeddedEngineConfig(model=str(tiny_vlm)))  # raises ModelNotFoundError if it does not


async def test_server_info_says_it_takes_images(server):
    info = await server[1].GetServerInfo(engine_pb2.GetServerInfoRequest(), timeout=10)
    assert info.supports_images and info.max_images_per_request == 4
    assert info.vocab_size == 49192  # the text config's vocabulary (the top-level config has none)


async def test_one_image_then_another_equal_the_transformers_recompute(server, reference):
    model, processor = reference
    results = []
    for colour in (RED, BLUE):
        ids, media, pixels = _prompt(processor, _text("What is in this picture?"), [colour])
        out, logprobs, complete = await _generate(server, ids, media)
        assert complete.prompt_images == 1 and complete.prompt_tokens == len(ids)
        _assert_matches(_recompute(model, ids, out, pixels), out, logprobs)
        results.append(logprobs)
    assert results[0] != pytest.approx(results[1], abs=1e-3)  # another picture, other logprobs


async def test_two_images_equal_the_transformers_recompute(server, reference):
    model, processor = reference
    ids, media, pixels = _prompt(processor, _text("Which of the two is larger?", images=2), [GREEN, RED])
    assert len(media) == 2 and media[0].offset + media[0].length == media[1].offset
    out, logprobs, complete = await _generate(server, ids, media)
    assert complete.prompt_images == 2
    _assert_matches(_recompute(model, ids, out, pixels), out, logprobs)


async def test_prefix_cache_is_keyed_by_thepicture(server, reference):
    model, processor = reference
    system = "<|im_start|>system\nYou are an assistant who looks at pictures and answers briefly.<|im_end|>\n"
    text = _text("Describe the picture in a few words, please.", system=system)
    ids, red, _ = _prompt(processor, text, [RED])
    _, blue, blue_pixels = _prompt(processor, text, [BLUE])
    assert red[0].offset > BLOCK and (len(ids) - 1) // BLOCK * BLOCK > red[0].offset + red[0].length
    await server[1].FlushCache(engine_pb2.FlushCacheRequest(), timeout=30)
    await _generate(server, ids, red)
    # same ids, another picture: nothing from the first block that overlaps the image on
    out, logprobs, complete = await _generate(server, ids, blue)
    assert 0 < complete.cached_prompt_tokens <= red[0].offset // BLOCK * BLOCK
    _assert_matches(_recompute(model, ids, out, blue_pixels), out, logprobs)
    # the same picture again: a hit past the image
    _, _, again = await _generate(server, ids, red)
    assert again.cached_prompt_tokens > red[0].offset + red[0].length


async def test_a_cache_hit_that_ends_inside_an_image(server, reference):
    """The cached prefix ends within the image's span: prefill places only the rest of its features."""
    model, processor = reference
    await server[1].FlushCache(engine_pb2.FlushCacheRequest(), timeout=30)
    first, media, _ = _prompt(processor, _text("What colour is it?"), [GREEN])
    end = media[0].offset + media[0].length
    await _generate(server, first, media)
    ids, media, pixels = _prompt(processor, _text("Is it round?"), [GREEN])
    assert ids[:end] == first[:end] and ids[end] != first[end]
    out, logprobs, complete = await _generate(server, ids, media)
    assert media[0].offset < complete.cached_prompt_tokens < end  # the hit stops inside the span
    _assert_matches(_recompute(model, ids, out, pixels), out, logprobs)


async def _refused(server, ids, media) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await _generate(server, ids, media)
    return caught.value


async def test_a_span_that_is_not_the_models_expansion_is_refused(server, reference):
    _, processor = reference
    ids, media, _ = _prompt(processor, _text("What is it?"), [RED])
    image_id = processor.tokenizer.convert_tokens_to_ids("<image>")
    wrong = list(ids)
    wrong[media[0].offset + 5] = processor.tokenizer.convert_tokens_to_ids("a")  # one <image> id less
    error = await _refused(server, wrong, media)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "media[0]: the span" in error.details() and "differs from the model's expansion" in error.details()
    # an image token outside every span (no media at all)
    error = await _refused(server, ids, [])
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"prompt_ids[{ids.index(image_id)}] is the image token" in error.details()
    # the server still answers
    out, _, complete = await _generate(server, ids, media, tokens=2)
    assert len(out) == 2 and complete.prompt_images == 1


async def test_text_only_prompts_give_smollm2s_logprobs(server, reference):
    import torch
    from transformers import AutoModelForCausalLM

    from agentloop_grpc.common import model_store

    smollm2 = AutoModelForCausalLM.from_pretrained(model_store.prepare(), dtype=torch.float32).eval()
    ids = reference[1].tokenizer.encode(_text("Name a colour.", images=0))
    out, logprobs, complete = await _generate(server, ids, tokens=8)
    assert complete.prompt_images == 0
    _assert_matches(_recompute(smollm2, ids, out, {}), out, logprobs)


async def test_a_weight_update_of_the_vision_part_changes_what_pictures_give(server, reference, tiny_vlm):
    """The connector is a parameter like any other: UpdateWeights reaches the features (and flushes the cache)."""
    from safetensors import safe_open

    _, processor = reference
    ids, media, _ = _prompt(processor, _text("What is in this picture?"), [BLUE])
    name = "model.connector.modality_projection.proj.weight"
    with safe_open(str(tiny_vlm / "model.safetensors"), framework="pt") as weights:
        original = weights.get_tensor(name)

    async def update(value):
        chunk = engine_pb2.TensorChunk(name=name, dtype=engine_pb2.TENSOR_DTYPE_FLOAT32, shape=list(value.shape),
                                       data=value.numpy().tobytes())
        commit = engine_pb2.UpdateWeightsCommit(flush_cache=True)
        messages = [engine_pb2.UpdateWeightsRequest(tensor=chunk), engine_pb2.UpdateWeightsRequest(commit=commit)]
        await server[1].UpdateWeights(iter(messages), timeout=60)

    _, before, _ = await _generate(server, ids, media)
    await update(original * 2)
    try:
        _, changed, complete = await _generate(server, ids, media)
        assert complete.cached_prompt_tokens == 0
        assert changed != pytest.approx(before, abs=1e-3)
    finally:
        await update(original)
    _, restored, _ = await _generate(server, ids, media)
    assert restored == pytest.approx(before, abs=1e-4)
