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
from .config import AgentLoopConfig
from .interaction import Interaction
from .parsers import HermesParser, ToolCallParser
from .reward import RewardFunction, default_reward
from .tracing import Tracer


class Generator(Protocol):
    """What a loop needs of the engines: the Router satisfies it."""

    async def generate(self, call: GenerateCall) -> GenerateResult: ...


@dataclass(frozen=True)
class LoopContext:
    generator: Generator
    codec: ChatCodec
    config: AgentLoopConfig = field(default_factory=AgentLoopConfig)
    tools: ToolClient | None = None
    #: The tools' specs, by name (ListTools once per worker).
    tool_specs: Mapping[str, ToolSpec] = field(default_factory=dict)
    parser: ToolCallParser = field(default_factory=HermesParser)
    reward: RewardFunction = default_reward
    interactions: Mapping[str, Interaction] = field(default_factory=dict)
    tracer: Tracer | None = None
