"""The two-turn image loop (image_loop.py) on the embedded engine serving the tiny vision-language model: the model
calls ``draw``, and its second turn is generated with the tool's picture in its prompt. That turn's tokens and
logprobs are what transformers computes for the same ids with the same picture's pixel values.

The picture means nothing to this model (its vision part is random); what it writes is checked only against the
recompute. SmolLM2 does not call the tool by itself (greedy, it writes Python), so the turns are constrained to the
call format: the recompute applies the same grammar (xgrammar) to transformers' logits, since the engine reports
logprobs under the distribution it sampled from.
"""

from __future__ import annotations

import pytest

from agentloop_grpc.agent import AgentLoopConfig, SamplingConfig
from agentloop_grpc.agent.spec import load_codec

from .image_loop import check_image_trajectory, pixels_of, recompute_second_turn, run_image_loop, second_turn
from .pictures import png

pytestmark = pytest.mark.slow

GREEDY = AgentLoopConfig(sampling=SamplingConfig(temperature=0.0), max_new_tokens_per_turn=40,
                         max_assistant_turns=2, constrain_tool_calls=True, max_parallel_tool_calls=1)


@pytest.fixture(scope="module")
async def drawn(tiny_vlm):
    from agentloop_grpc.engine_adapters.embedded import EmbeddedEngine, EmbeddedEngineConfig
    from agentloop_grpc.engine_adapters.server import create_server, start_adapter

    server = await create_server(EmbeddedEngine(EmbeddedEngineConfig(model=str(tiny_vlm), max_model_len=1024)),
                                 "127.0.0.1:0")
    await start_adapter(server)
    codec = load_codec(str(tiny_vlm))
    try:
        trajectory, recorded = await run_image_loop(f"127.0.0.1:{server.port}", codec, GREEDY)
    finally:
        await server.stop(grace_s=1)
    return trajectory, recorded, codec


async def test_the_second_turn_sees_the_picture(drawn, tiny_vlm_reference):
    t, recorded, codec = drawn
    image = check_image_trajectory(t, recorded, codec)
    model, _ = tiny_vlm_reference
    second = second_turn(t)
    engine = [t.response_logprobs[i - len(t.prompt_ids)] for i in second]
    logprobs, picks = recompute_second_turn(model, t, recorded, codec, pixels_of(codec, image.data))
    assert engine == pytest.approx(logprobs, abs=1e-4)
    assert picks == [(t.prompt_ids + t.response_ids)[i] for i in second]  # greedy: the model's picks in the grammar
    # the picture is in what the engine ran: another picture's features give other logprobs
    blue, _ = recompute_second_turn(model, t, recorded, codec, pixels_of(codec, png((0, 0, 255))))
    assert engine != pytest.approx(blue, abs=1e-3)
