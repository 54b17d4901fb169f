"""The fake engine and images: its tokens depend on the pictures (so a test sees a picture reached it), it counts
them, and its prefix cache keys the blocks an image's span overlaps by the picture."""

from __future__ import annotations

from agentloop_grpc.common.media import MediaInput
from agentloop_grpc.common.types import GenerateComplete, GenerateRequest, SamplingParams
from agentloop_grpc.engine_adapters.fake import FakeEngine
from agentloop_grpc.engine_adapters.fake_config import FakeEngineConfig

from ..multimodal.pictures import png

RED = png((255, 0, 0))
BLUE = png((0, 0, 255))
PROMPT = tuple(range(300, 340)) + (7,) * 19 + tuple(range(400, 437))  # an image's span at [40, 59)


async def _run(engine: FakeEngine, request_id: str, pictures: tuple[bytes, ...]) -> tuple[list[int], GenerateComplete]:
    media = tuple(MediaInput("image/png", picture, 40, 19) for picture in pictures)
    sampling = SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True)
    tokens: list[int] = []
    async for event in engine.generate(GenerateRequest(request_id, PROMPT, sampling, media=media)):
        if isinstance(event, GenerateComplete):
            return tokens, event
        tokens.extend(event.token_ids)
    raise AssertionError("no completion")


async def test_the_tokens_depend_on_the_picture_and_the_facts_say_images() -> None:
    engine = FakeEngine(FakeEngineConfig(max_images_per_request=3))
    facts = await engine.start(lambda: 0)
    assert (facts.supports_images, facts.max_images_per_request) == (True, 3)
    text, text_end = await _run(engine, "text", ())
    red, red_end = await _run(engine, "red", (RED,))
    blue, _ = await _run(engine, "blue", (BLUE,))
    red_again, _ = await _run(engine, "red-again", (RED,))
    assert red == red_again
    assert len({tuple(text), tuple(red), tuple(blue)}) == 3
    assert (text_end.prompt_images, red_end.prompt_images) == (0, 1)
    await engine.shutdown()


async def test_cached_blocks_stop_at_the_first_block_of_another_picture() -> None:
    engine = FakeEngine(FakeEngineConfig(block_size=16))
    await engine.start(lambda: 0)
    await _run(engine, "red", (RED,))
    _, blue = await _run(engine, "blue", (BLUE,))
    _, red = await _run(engine, "red-again", (RED,))
    _, text = await _run(engine, "text", ())
    assert blue.cached_prompt_tokens == 32  # the blocks before the one the span [40, 59) starts in
    assert red.cached_prompt_tokens == 80  # every block before the last prompt token's
    assert text.cached_prompt_tokens == 32  # the same ids without a picture are yet another prompt
    await engine.shutdown()

