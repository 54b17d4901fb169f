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
from agentloop_grpc.common.media import decode_image

from .image_loop import check_image_trajectory, run_image_loop
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


async def test_the_second_turn_sees_the_picture(drawn, tiny_vlm):
    import torch
    from transformers import AutoModelForImageTextToText

    t, recorded, codec = drawn
    image = check_image_trajectory(t, recorded, codec)
    # the second turn: the model tokens after the tool delta, recomputed by transformers with the picture
    ids = list(t.prompt_ids + t.response_ids)
    p = len(t.prompt_ids)
    second = [p + i for i in range(len(t.response_mask)) if t.response_mask[i] and p + i > image.end]
    assert second and second == list(range(second[0], second[-1] + 1))
    pixels = {k: torch.as_tensor(v) for k, v in
              codec.images.expand(decode_image(image.data, image.mime_type)).inputs.items()}
    model = AutoModelForImageTextToText.from_pretrained(tiny_vlm, dtype=torch.float32).eval()
    grammar = recorded.calls[-1].structured_output.spec
    produced = ids[second[0] : second[-1] + 1]

    def recompute(pixels) -> tuple[list[float], list[int]]:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids[: second[-1]]]), **pixels).logits[0]
        return _under_grammar(logits[second[0] - 1 : second[-1]], produced, grammar, codec, logits.size(-1))

    engine = [t.response_logprobs[i - p] for i in second]
    logprobs, picks = recompute(pixels)
    assert engine == pytest.approx(logprobs, abs=1e-4)
    assert picks == produced  # greedy: what the model picks inside the grammar
    # the picture is in what the engine ran: another picture's features give other logprobs
    blue = codec.images.expand(decode_image(png((0, 0, 255)), "image/png")).inputs
    assert engine != pytest.approx(recompute({k: torch.as_tensor(v) for k, v in blue.items()})[0], abs=1e-3)


def _under_grammar(logits, produced: list[int], grammar: str, codec, vocab: int) -> tuple[list[float], list[int]]:
    """The logprob of each produced token under the grammar-masked distribution, and the greedy pick there."""
    import torch
    import xgrammar as xgr

    info = xgr.TokenizerInfo.from_huggingface(codec.tokenizer, vocab_size=vocab)
    matcher = xgr.GrammarMatcher(xgr.GrammarCompiler(info).compile_grammar(grammar))
    bitmask = xgr.allocate_token_bitmask(1, vocab)
    chosen, picks = [], []
    for row, token in zip(logits, produced, strict=True):
        matcher.fill_next_token_bitmask(bitmask)
        masked = row.clone()[None]
        xgr.apply_token_bitmask_inplace(masked, bitmask, vocab_size=vocab)
        logprobs = torch.log_softmax(masked[0], dim=-1)
        picks.append(int(logprobs.argmax()))
        chosen.append(float(logprobs[token]))
        matcher.accept_token(token)
    return chosen, picks
