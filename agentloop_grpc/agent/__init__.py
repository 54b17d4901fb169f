"""The agent-loop runtime: loops, tool-call parsing, token-exact trajectories, workers and the manager.

``AgentLoopManager.generate(samples)`` is the trainer's entry point; ``Trajectory`` what comes back; ``to_batch``
the padded tensors; ``write_parquet`` the record. See docs/agent-loops.md, and docs/architecture.md for where the
runtime sits.
"""

from .batch import TrainerBatch, to_batch
from .chat import ChatCodec
from .config import AgentLoopConfig, SamplingConfig
from .context import LoopContext
from .interaction import Interaction, InteractionTurn, RetryOnWrongAnswer
from .loops import AgentLoop, LoopRegistry, LoopState, SingleTurnLoop, ToolLoop
from .manager import AgentLoopManager, RolloutBatch
from .metrics import RolloutMetrics
from .parquet import read_parquet, write_parquet
from .parsers import (
    GptOssParser,
    HermesParser,
    Llama3JsonParser,
    ParsedTurn,
    ParseError,
    Qwen3CoderParser,
    ToolCall,
    ToolCallParser,
    make_parser,
)
from .reward import Outcome, RewardFunction, Score
from .sample import Sample
from .spec import ComponentSpec, WorkerSpec
from .tracing import JsonlTracer
from .trajectory import Termination, Timings, Trajectory
from .worker import AgentLoopWorker

__all__ = [
    "AgentLoop", "AgentLoopConfig", "AgentLoopManager", "AgentLoopWorker", "ChatCodec", "ComponentSpec", "GptOssParser",
    "HermesParser", "Interaction", "InteractionTurn", "JsonlTracer", "Llama3JsonParser", "LoopContext", "LoopRegistry",
    "LoopState", "Outcome", "ParseError", "ParsedTurn", "Qwen3CoderParser", "RetryOnWrongAnswer", "RewardFunction",
    "RolloutBatch", "RolloutMetrics", "Sample", "SamplingConfig", "Score", "SingleTurnLoop", "Termination", "Timings",
    "ToolCall", "ToolCallParser", "ToolLoop", "TrainerBatch", "Trajectory", "WorkerSpec", "make_parser", "read_parquet",
    "to_batch", "write_parquet",
]
