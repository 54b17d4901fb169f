"""ToolLoop: the multi-turn tool-using loop as a state machine.

    PENDING -> GENERATING -> PROCESSING_TOOLS -> GENERATING -> ...
                        \\-> INTERACTING -> GENERATING -> ...      (no tool call and an interaction)
                        \\-> TERMINATED                            (any limit, no call, a final tool, an error)

GENERATING appends the engine's tokens verbatim. PROCESSING_TOOLS parses the turn's calls (a malformed call becomes
a tool-error message the model reads), runs up to ``max_parallel_tool_calls`` of them concurrently on the
trajectory's own tool instances, truncates long responses, and appends all responses of the turn as one template
delta; a tool's images become image parts of its message (text first, then the images), expanded in that delta and
kept in the trajectory. INTERACTING asks the sample's interaction for the next user turn and records its score. Tool
instances are created on first use (with the sample's ``tools_kwargs``), rewarded at the end, and always released.

Every executed call's metrics (what the tool server returned) are kept in ``Trajectory.tool_call_metrics``. A tool
whose spec has ``wants_loop_state`` gets the loop's state (turn, messages so far, sample id) with each call; other
tools get nothing extra. ``max_user_turns`` counts interaction replies, and also tool rounds when
``count_tool_rounds_as_user_turns`` (verl's counting). A sample's own ``sampling`` is used for all of its turns.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import time
from typing import Any

from agentloop_grpc.common.media import ImageError
from agentloop_grpc.common.types import FinishReason, StructuredOutput
from agentloop_grpc.tools.client import ToolInfrastructureError
from agentloop_grpc.tools.result import LoopSnapshot

from ..config import AgentLoopConfig
from ..context import LoopContext
from ..episode import BudgetExceeded, Episode
from ..errors import INFRASTRUCTURE_ERRORS, REQUEST_ERRORS, LoopError
from ..generation import Turn, generate_turn
from ..images import Picture
from ..interaction import Interaction
from ..parsers import ParsedTurn, ToolCall
from ..sample import Sample
from ..trajectory import INFRASTRUCTURE_CALL, Termination, ToolCallMetrics, Trajectory
from ..truncation import truncate

log = logging.getLogger(__name__)


class LoopState(enum.Enum):
    PENDING = "pending"
    GENERATING = "generating"
    PROCESSING_TOOLS = "processing_tools"
    INTERACTING = "interacting"
    TERMINATED = "terminated"


class _Run:
    """The mutable state of one run of the tool loop."""

    def __init__(self, context: LoopContext, sample: Sample) -> None:
        self.context = context
        self.sample = sample
        names = sorted(context.tool_specs) if sample.tools is None else list(sample.tools)
        unknown = [n for n in names if n not in context.tool_specs]
        if unknown:
            raise LoopError(
                f"sample {sample.sample_id} asks for unknown tools {unknown}; known: {sorted(context.tool_specs)}"
            )
        self.tool_names = names
        self.episode = Episode(context, sample, ToolLoop.name, [context.tool_specs[n].openai() for n in names])
        self.instances: dict[str, str] = {}
        self.instance_lock = asyncio.Lock()
        self.interaction: Interaction | None = None
        self.interaction_state: Any = None
        self.turn: Turn | None = None
        self.parsed: ParsedTurn | None = None
        self.final_tool_called = False
        #: User turns as max_user_turns counts them (tool rounds too under count_tool_rounds_as_user_turns).
        self.counted_user_turns = 0

    # -- tools ---------------------------------------------------------------------------------------------

    async def instance(self, tool: str) -> str:
        async with self.instance_lock:
            if tool not in self.instances:
                kwargs = self.sample.tools_kwargs.get(tool, {})
                self.instances[tool] = await self.context.tools.create_instance(tool, self.sample.sample_id, kwargs)
            return self.instances[tool]

    async def call(self, call: ToolCall, call_id: str, turn: int) -> dict[str, Any]:
        builder = self.episode.builder
        if call.name not in self.tool_names:
            builder.tool_errors += 1
            return _tool_message(
                call.name, f"Error: unknown tool {call.name!r}; available: {', '.join(self.tool_names)}"
            )
        try:
            instance, arguments = await self.instance(call.name), json.dumps(call.arguments)
            if self.context.tool_specs[call.name].wants_loop_state:
                state = LoopSnapshot(self.sample.sample_id, turn, tuple(dict(m) for m in builder.messages))
                result = await self.context.tools.execute(instance, arguments, call_id, loop_state=state)
            else:  # the plain call: a tool that did not ask for the state costs nothing extra (and old clients work)
                result = await self.context.tools.execute(instance, arguments, call_id)
        except ToolInfrastructureError:  # the call is on record as the infrastructure's; the trajectory ends
            builder.tool_call_metrics.append(ToolCallMetrics(call.name, turn, call_id, INFRASTRUCTURE_CALL))
            raise
        builder.tool_rewards.append(result.step_reward)
        builder.tool_call_metrics.append(ToolCallMetrics(
            call.name, turn, call_id, None if result.error_kind is None else result.error_kind.value,
            result.step_reward, dict(result.metrics),
        ))
        if call.name in self.context.config.end_on_tool:
            self.final_tool_called = True
        if result.is_error:
            builder.tool_errors += 1
            return _tool_message(call.name, f"Error ({result.error_kind.value}): {result.content}")
        try:
            pictures = [Picture.decode(image.data, image.mime_type) for image in result.images]
        except ImageError as error:  # the tool's fault, so the model reads it as the tool's error
            builder.tool_errors += 1
            return _tool_message(call.name, f"Error (invalid image): {error}")
        if pictures and self.context.codec.images is None:  # the text still helps; the images cannot be encoded
            return _tool_message(call.name, f"{result.content}\n(The tool returned {len(pictures)} images, which "
                                            "this model cannot see.)")
        return _tool_message(call.name, result.content, pictures)

    async def instance_rewards(self) -> dict[str, float]:
        return {name: (await self.context.tools.calc_reward(i)).reward for name, i in self.instances.items()}

    async def release(self) -> None:
        for name, instance in self.instances.items():
            try:
                await self.context.tools.release(instance)
            except Exception as error:  # noqa: BLE001 - release is best effort; the server's TTL reaps leftovers
                log.warning("releasing %s instance %s failed: %s", name, instance, error)


def _append_unless_ended(run: _Run, messages: list[dict[str, Any]], kind: str, seconds: float,
                         ended: Termination | None) -> Termination | None:
    """Append a tool or user phase's messages unless the episode already ``ended``; the termination if it ends
    here. A phase that ends the episode is still traced (its time belongs on the timeline), without token ids."""
    if ended is None:
        try:
            run.episode.continue_with(messages, run.turn.stopped_on, kind, seconds)
            return None
        except BudgetExceeded:
            ended = Termination.LENGTH
    run.episode.trace_unappended(kind, messages, seconds)
    return ended


def _truncated(content: str | list[dict[str, Any]], config: AgentLoopConfig) -> str | list[dict[str, Any]]:
    """A tool response's text cut to the limit (images are never cut: they are all or nothing)."""
    def cut(text: str) -> str:
        return truncate(text, config.max_tool_response_chars, config.tool_response_truncation)

    if isinstance(content, str):
        return cut(content)
    return [{**p, "text": cut(p["text"])} if p["type"] == "text" else p for p in content]


def _reached(count: int, limit: int | None) -> bool:
    return limit is not None and count >= limit


def _tool_message(name: str, content: str, pictures: list[Picture] | None = None) -> dict[str, Any]:
    if not pictures:
        return {"role": "tool", "name": name, "content": content}
    parts = [{"type": "text", "text": content}, *({"type": "image", "image": p} for p in pictures)]
    return {"role": "tool", "name": name, "content": parts}


class ToolLoop:
    name = "tool"

    def __init__(self, context: LoopContext) -> None:
        self.context = context
        # grammar per offered tool set: built once, not per turn (samples of a dataset share a few tool sets)
        self._grammars: dict[tuple[str, ...], StructuredOutput] = {}

    def _constraint(self, run: _Run) -> StructuredOutput | None:
        if not self.context.config.constrain_tool_calls or not run.tool_names:
            return None
        key = tuple(run.tool_names)
        if key not in self._grammars:
            grammar = self.context.parser.constraint(run.episode.tools, self.context.config.max_parallel_tool_calls)
            self._grammars[key] = StructuredOutput("ebnf_grammar", grammar)
        return self._grammars[key]

    async def run(self, sample: Sample) -> Trajectory:
        run = _Run(self.context, sample)
        episode = run.episode
        episode.builder.constrained = self._constraint(run) is not None
        termination, error, infrastructure, cause = Termination.STOP, None, False, None
        interaction_score = None
        rewards: dict[str, float] = {}
        try:
            if sample.interaction is not None:
                if sample.interaction not in self.context.interactions:
                    raise LoopError(f"no interaction named {sample.interaction!r}")
                run.interaction = self.context.interactions[sample.interaction]
                run.interaction_state = await run.interaction.start(sample)
            termination = await self._drive(run)
            if run.interaction is not None:
                interaction_score = await run.interaction.final_score(run.interaction_state)
            if run.instances:
                rewards = await run.instance_rewards()
        except INFRASTRUCTURE_ERRORS as exc:
            termination, error, infrastructure, cause = Termination.ERROR, str(exc), True, exc.cause
        except REQUEST_ERRORS as exc:
            termination, error = Termination.ERROR, str(exc)
        finally:
            await run.release()
            if run.interaction is not None:
                await run.interaction.finish(run.interaction_state)
        return await episode.finish(termination, rewards, interaction_score, error, infrastructure, cause)

    async def _drive(self, run: _Run) -> Termination:
        """Step the state machine until TERMINATED; return why it ended."""
        config = self.context.config
        state = LoopState.GENERATING
        while True:
            # 1. GENERATING: one assistant turn, tokens appended as produced.
            if state is LoopState.GENERATING:
                budget = min(config.max_new_tokens_per_turn, run.episode.budget_left)
                if budget <= 0:
                    return Termination.LENGTH
                builder = run.episode.builder
                run.turn = await generate_turn(
                    self.context, builder, builder.assistant_turns, budget, self._constraint(run), run.sample.sampling
                )
                text = self.context.codec.assistant_text(run.turn.token_ids, run.turn.stopped_on)
                run.parsed = self.context.parser.parse(text)
                human: dict[str, Any] = {"role": "assistant", "content": run.parsed.content}
                if run.parsed.calls:
                    human["tool_calls"] = [
                        c.openai(f"{run.sample.sample_id}-{run.episode.builder.assistant_turns}-{i}")
                        for i, c in enumerate(run.parsed.calls)
                    ]
                run.episode.model_turn(run.turn, text, human)
                if run.turn.finish_reason is FinishReason.LENGTH:
                    return Termination.LENGTH
                if run.parsed.calls or run.parsed.errors:
                    state = LoopState.PROCESSING_TOOLS
                elif run.interaction is not None:
                    state = LoopState.INTERACTING
                else:
                    return Termination.NO_TOOL_CALL if run.tool_names else Termination.STOP
            # 2. PROCESSING_TOOLS: run the calls, answer malformed ones, append all responses as one delta.
            elif state is LoopState.PROCESSING_TOOLS:
                started = time.monotonic()
                messages = await self._process_tools(run)
                seconds = time.monotonic() - started
                ended = None
                if run.final_tool_called:
                    ended = Termination.STOP
                elif run.episode.builder.assistant_turns >= config.max_assistant_turns or (
                        config.count_tool_rounds_as_user_turns
                        and _reached(run.counted_user_turns, config.max_user_turns)):
                    ended = Termination.TURN_LIMIT
                if (ended := _append_unless_ended(run, messages, "tool", seconds, ended)) is not None:
                    return ended
                if config.count_tool_rounds_as_user_turns:
                    run.counted_user_turns += 1
                state = LoopState.GENERATING
            # 3. INTERACTING: the user simulator answers the turn.
            elif state is LoopState.INTERACTING:
                started = time.monotonic()
                reply = await run.interaction.respond(run.interaction_state, list(run.episode.builder.messages))
                seconds = time.monotonic() - started
                run.episode.builder.interaction_s += seconds
                run.episode.builder.turn_scores.append(reply.score)
                said = [{"role": "user", "content": reply.content}]
                ended = None
                if reply.done:
                    ended = Termination.STOP
                elif (_reached(run.counted_user_turns, config.max_user_turns)
                        or run.episode.builder.assistant_turns >= config.max_assistant_turns):
                    ended = Termination.TURN_LIMIT
                if (ended := _append_unless_ended(run, said, "user", seconds, ended)) is not None:
                    return ended
                run.episode.builder.user_turns += 1
                run.counted_user_turns += 1
                state = LoopState.GENERATING

    async def _process_tools(self, run: _Run) -> list[dict[str, Any]]:
        config = self.context.config
        builder = run.episode.builder
        parsed = run.parsed
        started = time.monotonic()
        calls = list(parsed.calls[: config.max_parallel_tool_calls])
        builder.tool_calls += len(parsed.calls)
        builder.malformed_tool_calls += len(parsed.errors)
        turn = builder.assistant_turns - 1  # the turn that made the calls: its ids name them in its message too
        if calls and self.context.tools is None:
            raise LoopError("the model called tools but the worker has no tool client")
        results = await asyncio.gather(
            *(run.call(c, f"{run.sample.sample_id}-{turn}-{i}", turn) for i, c in enumerate(calls))
        )
        messages = [{**m, "content": _truncated(m["content"], config)} for m in results]
        for extra in parsed.calls[config.max_parallel_tool_calls :]:
            builder.tool_errors += 1
            messages.append(_tool_message(
                extra.name,
                f"Error: at most {config.max_parallel_tool_calls} tool calls per turn; this call was not run.",
            ))
        for error in parsed.errors:
            builder.tool_errors += 1
            messages.append(_tool_message("", f"Error: the tool call could not be parsed: {error.reason}."))
        builder.tools_s += time.monotonic() - started
        return messages
