"""WorkerSpec: everything needed to build a worker, as plain data, so a Ray actor on another node can build its
own (channels, tokenizer and tool list cannot be pickled; a spec can).

Python parts (reward function, interactions, loops of your own) are named by import path ``module:attribute``,
resolved when the worker is built: explicit, no registry filled at import time. A custom loop is built once per
worker as ``attribute(context, **kwargs)`` (the worker's LoopContext, then the loop's own config) and added to the
built-in loops under its name (see loops/base.py); the same spec reaches in-process and Ray workers alike.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from agentloop_grpc.client_security import ClientSecurity
from agentloop_grpc.common.weight_layout import DEFAULT_TIMEOUT_S
from agentloop_grpc.router import ExpectedVersion, Fleet, Router, RouterConfig

from .chat import ChatCodec
from .config import AgentLoopConfig
from .context import LoopContext
from .loops.base import BUILTIN_LOOPS, AgentLoop, LoopRegistry
from .tracing import JsonlTracer
from .weight_transfer import WeightTransferKind
from .worker import AgentLoopWorker

WeightUpdatePause = Literal["none", "abort", "keep", "wait"]


class ComponentSpec(BaseModel):
    """A Python object built from an import path and keyword arguments."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str = Field(description="module:attribute, e.g. agentloop_grpc.agent.interaction:RetryOnWrongAnswer")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments when the attribute is a "
                                   "class (a loop's class or factory: its own config, after the worker's context).")

    def resolve(self) -> Any:
        """The attribute itself (ImportError, AttributeError or ValueError when the path names none)."""
        module, _, attribute = self.path.partition(":")
        if not attribute:
            raise ValueError(f"{self.path!r} is not of the form module:attribute")
        return getattr(importlib.import_module(module), attribute)

    def load(self) -> Any:
        """The attribute, or an instance built with the kwargs when it is a class."""
        target = self.resolve()
        return target(**self.kwargs) if isinstance(target, type) else target

    def call(self, *args: Any) -> Any:
        """The attribute (a class or a factory) called with ``args``, then the kwargs."""
        return self.resolve()(*args, **self.kwargs)


def _custom_loop_names(loops: dict[str, ComponentSpec]) -> dict[str, ComponentSpec]:
    taken = sorted(set(loops) & set(BUILTIN_LOOPS))
    if taken:
        raise ValueError(f"{taken} are built-in loop names; give your loops other names")
    return loops


#: Loops of your own by name, each built as ``Class(context, **kwargs)``; a built-in's name is refused.
CustomLoops = Annotated[dict[str, ComponentSpec], AfterValidator(_custom_loop_names)]


class WorkerSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    engines: tuple[str, ...] = Field((), description="Engine server addresses (host:port).")
    discovery_file: str | None = Field(None, description="A launcher's discovery file, instead of engines.")
    tool_server: str | None = Field(None, description="ToolExecute server address; None: no tools.")
    tool_security: ClientSecurity | None = Field(None, description="TLS and token of the tool server.")
    model_dir: str | None = Field(None, description="Folder of the tokenizer; None: the default model's.")
    loop: AgentLoopConfig = Field(default_factory=AgentLoopConfig)
    router: RouterConfig = Field(default_factory=RouterConfig)
    max_concurrency: int = Field(256, ge=1, description="Loops running at once in one worker.")
    reward: ComponentSpec | None = Field(None, description="Reward function; None: the default (tool rewards).")
    interactions: dict[str, ComponentSpec] = Field(default_factory=dict, description="Interactions by name.")
    loops: CustomLoops = Field(
        default_factory=dict, description="Loops of your own by name, beside single_turn and tool: an import path "
        "module:Class built once per worker as Class(context, **kwargs), kwargs being the loop's own config.")
    weight_transfer: WeightTransferKind = Field(
        "auto", description="How update_weights reaches the engines: collective (one broadcast over a "
        "torch.distributed group of this process and every engine worker), path (a checkpoint they load, "
        "LoadWeights), stream (UpdateWeights), auto (collective if the group forms, else path when every engine is "
        "on this machine or weights_dir is set, else stream).")
    weight_update_pause: WeightUpdatePause = Field(
        "none", description="What running generations do during update_weights: none (they go on; each engine "
        "swaps the weights in between two decode steps, tokens carry the version that produced them), abort (they "
        "are aborted and the loops resume them with the new weights), keep (frozen, then continued), wait (they "
        "finish first).")
    weight_group_address: str | None = Field(None, description="The address engines reach this process by, for "
                                             "collective transfers; None: the one on the route to the first engine.")
    weight_group_timeout_s: float = Field(
        DEFAULT_TIMEOUT_S, gt=0, le=86400, description="Collective transfers: how long the group may take to form, "
        "and each of its collectives (a piece of the broadcast) to complete; a member lost mid-update (a partition, "
        "a crash) fails the update on every member within about this long, and none applies it.")
    weights_dir: str | None = Field(None, description="Folder every engine can read, for path transfers (shared "
                                    "storage across machines); None: a temporary folder (engines on this machine).")
    trace_path: str | None = Field(None, description="Append one JSON line per turn here (per worker: a suffix "
                                   "with the worker index is added when there are several).")

    def make_router(self, expected: ExpectedVersion | None = None) -> Router:
        """A Router over this spec's engines (not entered yet); ``expected``: the weight version it shares."""
        if self.discovery_file:
            return Router.from_discovery_file(self.discovery_file, self.router, expected)
        return Router(list(self.engines), self.router, expected=expected)

    def make_fleet(self, expected: ExpectedVersion | None = None) -> Fleet:
        """A Fleet over this spec's engines (not entered yet), for control calls alone."""
        if self.discovery_file:
            return Fleet.from_discovery_file(self.discovery_file, self.router, expected)
        return Fleet(list(self.engines), self.router, expected=expected)


def build_loops(loops: Mapping[str, ComponentSpec], context: LoopContext) -> dict[str, AgentLoop]:
    """Each custom loop built on ``context``; an error names the loop's field (``loops.NAME``)."""
    built = {}
    for name, component in loops.items():
        try:
            loop = component.call(context)
        except Exception as error:  # a user's constructor may raise anything: the message still names the loop
            raise ValueError(f"loops.{name}: {component.path} could not be built ({type(error).__name__}: "
                             f"{error})") from error
        if not inspect.iscoroutinefunction(getattr(loop, "run", None)):
            raise ValueError(f"loops.{name}: {component.path} gave a {type(loop).__name__}, which has no "
                             "async run(sample) method")
        built[name] = loop
    return built


def load_codec(model_dir: str | None, loop: AgentLoopConfig | None = None) -> ChatCodec:
    """The tokenizer of ``model_dir`` with the loop's chat template (None: the tokenizer's own template), and its
    image processor when the checkpoint has one that takes images."""
    from agentloop_grpc.common import model_store
    from agentloop_grpc.common.media import ImageExpander

    folder = Path(model_dir) if model_dir else model_store.prepare()
    loop = loop or AgentLoopConfig()
    # only a checkpoint that saved a processor can take images: text-only folders skip loading one
    has_processor = any((folder / name).is_file() for name in ("processor_config.json", "preprocessor_config.json"))
    return ChatCodec(model_store.load_tokenizer(folder), loop.chat_template, loop.chat_template_kwargs,
                     ImageExpander.load(str(folder)) if has_processor else None)


async def build_worker(spec: WorkerSpec, stack: AsyncExitStack, index: int = 0,
                       expected: ExpectedVersion | None = None) -> tuple[AgentLoopWorker, Router]:
    """Build a worker and what it owns (closed by ``stack``); ``expected``: the weight version its Router shares."""
    from agentloop_grpc.tools.client import GrpcToolClient

    router = await stack.enter_async_context(spec.make_router(expected))
    tools, specs = None, {}
    if spec.tool_server:
        tools = GrpcToolClient(spec.tool_server, security=spec.tool_security)
        stack.push_async_callback(tools.close)
        specs = {s.name: s for s in await tools.list_tools()}
    tracer = None
    if spec.trace_path:
        path = Path(spec.trace_path)
        tracer = JsonlTracer(path if index == 0 else path.with_suffix(f".{index}{path.suffix}"))
        stack.callback(tracer.close)
    context_args: dict[str, Any] = {}
    if spec.reward is not None:
        context_args["reward"] = spec.reward.load()
    context = LoopContext(
        generator=router,
        codec=load_codec(spec.model_dir, spec.loop),
        config=spec.loop,
        tools=tools,
        tool_specs=specs,
        interactions={name: component.load() for name, component in spec.interactions.items()},
        tracer=tracer,
        **context_args,
    )
    registry = LoopRegistry.default(context, build_loops(spec.loops, context))
    return AgentLoopWorker(registry, spec.max_concurrency), router
