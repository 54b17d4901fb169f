"""LoopContext: what every loop of a worker shares (engines, tools, codec, parser, reward, interactions, tracer).

Built once per worker, never per sample: the tool list is fetched once, the tokenizer loaded once, and nothing in
it is mutated by a loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from agentloop_grpc.router.call import GenerateCall
from agentloop_grpc.router.result import GenerateResult
from agentloop_grpc.tools.client import ToolClient
from agentloop_grpc.tools.result import ToolSpec

from .chat import ChatCodec
from .config import AgentLoopConfig, SamplingConfig
from .interaction import Interaction
from .parsers import ToolCallParser, make_parser, stop_token_ids
from .reward import RewardFunction, default_reward
from .tracing import Tracer


class Generator(Protocol):
    """What a loop needs of the engines: the Router satisfies it."""

    async def generate(self, call: GenerateCall) -> GenerateResult: ...

    def close_session(self, session_id: str) -> None:
        """The session's trajectory ended: its placement may be forgotten (the Router's memory stays flat)."""
        ...


@dataclass(frozen=True)
class LoopContext:
    generator: Generator
    codec: ChatCodec
    config: AgentLoopConfig = field(default_factory=AgentLoopConfig)
    tools: ToolClient | None = None
    #: The tools' specs, by name (ListTools once per worker).
    tool_specs: Mapping[str, ToolSpec] = field(default_factory=dict)
    #: None: the format ``config.tool_parser`` names, typed by ``tool_specs``.
    parser: ToolCallParser = None  # type: ignore[assignment]
    reward: RewardFunction = default_reward
    interactions: Mapping[str, Interaction] = field(default_factory=dict)
    tracer: Tracer | None = None

    def __post_init__(self) -> None:
        if self.parser is None:
            tools = [spec.openai() for spec in self.tool_specs.values()]
            object.__setattr__(self, "parser", make_parser(self.config.tool_parser, tools))
        extra = stop_token_ids(self.parser, self.codec.encode) if self.parser.stop_tokens else ()
        if extra:  # the format's call-ending tokens end every turn, as the template's end of turn does
            object.__setattr__(self, "config", _with_stop_ids(self.config, extra))


def _with_stop_ids(config: AgentLoopConfig, ids: tuple[int, ...]) -> AgentLoopConfig:
    def add(sampling: SamplingConfig) -> SamplingConfig:
        return sampling.model_copy(update={"stop_token_ids": tuple(dict.fromkeys((*sampling.stop_token_ids, *ids)))})

    return config.model_copy(update={"sampling": add(config.sampling),
                                     "turn_sampling": tuple(add(s) for s in config.turn_sampling)})
