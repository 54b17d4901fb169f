"""The two-turn image loop, against any engine server: the model's first turn calls the ``draw`` tool (a real
ToolExecute server on loopback), the tool's picture enters the conversation as one template delta, and the second
turn is generated with the picture in its prompt. Shared by the fake-, embedded- and vLLM-engine tests;
``check_image_trajectory`` is what every engine must satisfy. The picture means nothing to the tiny model (its
vision part is random): the tests check where its ids go and what the engine ran, not what the model says.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from itertools import groupby

from agentloop_grpc.agent import AgentLoopConfig, ChatCodec, LoopContext, Sample, ToolLoop, Trajectory
from agentloop_grpc.common.media import MediaInput, decode_image
from agentloop_grpc.router import GenerateCall, GenerateResult, Router, RouterConfig
from agentloop_grpc.tools.client import GrpcToolClient
from agentloop_grpc.tools.config import ToolServerConfig
from agentloop_grpc.tools.server import create_tool_server

QUESTION = "Call the draw tool to draw a red square, then describe the picture."
#: The first turn a scripted model sends (Hermes format).
DRAW_CALL = '<tool_call>\n{"name": "draw", "arguments": {"colour": "red"}}\n</tool_call>'


def image_sample(sample_id: str = "draw") -> Sample:
    return Sample(sample_id=sample_id, messages=({"role": "user", "content": QUESTION},), tools=("draw",))


@asynccontextmanager
async def draw_tools() -> AsyncIterator[GrpcToolClient]:
    """A client of a real tool server that serves tests/tools/image_tool.py's ``draw`` (and ``plot``, whose image
    does not decode)."""
    config = ToolServerConfig.model_validate({"tools": [{"function": "tests.tools.image_tool:draw"},
                                                        {"function": "tests.tools.image_tool:plot"}]})
    server = await create_tool_server(config, "127.0.0.1:0")
    client = GrpcToolClient(f"127.0.0.1:{server.port}")
    try:
        yield client
    finally:
        await client.close()
        await server.stop(grace_s=1)


class Recorded:
    """The Router, with every call and result kept."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self.calls: list[GenerateCall] = []
        self.results: list[GenerateResult] = []

    async def generate(self, call: GenerateCall) -> GenerateResult:
        self.calls.append(call)
        self.results.append(await self.router.generate(call))
        return self.results[-1]

    def close_session(self, session_id: str) -> None:
        self.router.close_session(session_id)


async def run_image_loop(address: str, codec: ChatCodec, config: AgentLoopConfig | None = None,
                         sample: Sample | None = None) -> tuple[Trajectory, Recorded]:
    """One run of the tool loop on ``sample`` (default: ``image_sample()``) against the engine at ``address``, and
    the generations it made."""
    async with Router([address], RouterConfig(no_server_wait_s=5)) as router, draw_tools() as tools:
        await router.fleet.wait_ready()
        specs = {s.name: s for s in await tools.list_tools()}
        recorded = Recorded(router)
        context = LoopContext(generator=recorded, codec=codec, config=config or AgentLoopConfig(), tools=tools,
                              tool_specs=specs)
        return await ToolLoop(context).run(sample or image_sample()), recorded


def check_image_trajectory(t: Trajectory, recorded: Recorded, codec: ChatCodec) -> MediaInput:
    """What every engine must satisfy; the picture's record (offsets in prompt + response ids)."""
    assert t.error is None, t.error
    # two turns, the first a call of draw (a constrained second turn calls it again; the loop then ends)
    assert t.assistant_turns == 2 and t.tool_errors == 0 and t.tool_call_metrics[0].tool == "draw"
    assert len(t.media) == 1
    image = t.media[0]
    assert image.mime_type == "image/png"
    ids = t.prompt_ids + t.response_ids
    # the span holds the processor's expansion of the tool's picture
    expansion = codec.images.expand(decode_image(image.data, image.mime_type)).ids
    assert ids[image.offset : image.end] == expansion
    # one mask-0 delta between the two model turns, and the picture inside it
    mask_runs = [(value, len(list(group))) for value, group in groupby(t.response_mask)]
    assert [value for value, _ in mask_runs][:3] == [1, 0, 1]
    start, end = mask_runs[0][1], mask_runs[0][1] + mask_runs[1][1]
    p = len(t.prompt_ids)
    assert p + start <= image.offset and image.end <= p + end
    assert "a red square" in codec.decode(t.response_ids[start:end])
    # a fresh render, pictures expanded, equals the record (up to the model's own token split of its text: a
    # grammar-constrained engine may pick another split of the same text)
    assert t.drift is None or t.drift.kind == "tokenization", t.drift
    # the first turn's call has no picture; the second carries it at its place in the prompt, and the engine read it
    assert [list(c.media) for c in recorded.calls] == [[], [image]]
    assert [r.prompt_images for r in recorded.results] == [0, 1]
    assert t.messages[2] == {"role": "tool", "name": "draw", "content": [
        {"type": "text", "text": "a red square"}, {"type": "image", "media": 0}]}
    return image


def second_turn(t: Trajectory) -> list[int]:
    """Positions (in prompt + response ids) of the model tokens after the picture: the second turn."""
    p, image = len(t.prompt_ids), t.media[0]
    second = [p + i for i, m in enumerate(t.response_mask) if m and p + i > image.end]
    assert second and second == list(range(second[0], second[-1] + 1))
    return second


def pixels_of(codec: ChatCodec, data: bytes, mime_type: str = "image/png") -> dict:
    """The processor's tensors for one picture, as torch tensors."""
    import torch

    return {k: torch.as_tensor(v) for k, v in codec.images.expand(decode_image(data, mime_type)).inputs.items()}


def recompute_second_turn(model, t: Trajectory, recorded: Recorded, codec: ChatCodec,
                          pixels: dict) -> tuple[list[float], list[int]]:
    """Transformers' logprobs of the second turn's tokens given ``pixels`` for the picture, under the grammar the
    turn was constrained by (the engines report logprobs under the distribution they sampled from), and the greedy
    pick at each position."""
    import torch
    import xgrammar as xgr

    ids = list(t.prompt_ids + t.response_ids)
    second = second_turn(t)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids[: second[-1]]]), **pixels).logits[0]
    vocab = logits.size(-1)
    info = xgr.TokenizerInfo.from_huggingface(codec.tokenizer, vocab_size=vocab)
    matcher = xgr.GrammarMatcher(xgr.GrammarCompiler(info).compile_grammar(recorded.calls[-1].structured_output.spec))
    bitmask = xgr.allocate_token_bitmask(1, vocab)
    chosen, picks = [], []
    for row, token in zip(logits[second[0] - 1 : second[-1]], ids[second[0] : second[-1] + 1], strict=True):
        matcher.fill_next_token_bitmask(bitmask)
        masked = row.clone()[None]
        xgr.apply_token_bitmask_inplace(masked, bitmask, vocab_size=vocab)
        logprobs = torch.log_softmax(masked[0], dim=-1)
        picks.append(int(logprobs.argmax()))
        chosen.append(float(logprobs[token]))
        matcher.accept_token(token)
    return chosen, picks
