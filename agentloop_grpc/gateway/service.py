"""SessionGateway: the sessions, their chains and their turns, behind every wire format.

A request for a model turn goes: (1) its session (created on first use) and its bounds; (2) the chain it appends
to, or a new chain (a fork, with its reason recorded); (3) its sampling: what the run forces over what the agent
asks, logprobs always recorded, the budget the chain has left; (4) the turn through the Router (failover with
resume and partial rollout across weight updates are the Router's and the turn's); (5) the reply parsed by the
run's tool-call format and the turn committed to the chain. A turn has at most the room its context has left (the
engines' max_model_len less its prompt): one with none ends at once with finish_reason length. A failure of the
engines fails the chain as an infrastructure failure (never trained on) and answers 502; a request the engine
refuses answers 400 and leaves the chain as it was; a client that goes away mid-turn records nothing. What a
request held that the gateway ignored is recorded on its session, counted by name and logged once (wire_checks.py).
Engines that cannot serve what the config asks of every turn (``return_routed_experts`` of an engine reporting no
routed layers) are refused once, when the gateway starts (``check_engines``), or, when no engine had answered
then, at the first request: 502, before any session is created.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncGenerator
from typing import Any

from agentloop_grpc.agent.chat import ChatCodec
from agentloop_grpc.agent.parsers import ParsedTurn, make_parser, stop_token_ids
from agentloop_grpc.agent.reward import Outcome, RewardFunction, score
from agentloop_grpc.agent.routing_check import RoutingUnavailableError, check_engine_routing
from agentloop_grpc.agent.sample import Sample
from agentloop_grpc.agent.trajectory import Termination, Trajectory
from agentloop_grpc.common.types import SamplingParams, StructuredOutput
from agentloop_grpc.router import InfrastructureError, RequestError, Router

from .chain import Chain, PendingTurn
from .config import ForcedSampling, GatewayConfig
from .exchange import ChatReply, ChatRequest, FinishReason, GatewayError, TextDelta
from .history import match, tools_key
from .lease import TurnLease
from .metrics import GatewayMetrics
from .prompt_encoder import PromptEncoder
from .sessions import Fork, Session, SessionSpec, SessionTable
from .turn import TurnOutput, TurnRun, TurnSpec, token_logprobs

log = logging.getLogger(__name__)

#: Distinct ignored field names one gateway labels its metric with; later ones count as ``OTHER_FIELD`` (a client
#: can make up names without end, and each label is a time series).
MAX_IGNORED_FIELDS = 256
OTHER_FIELD = "(other)"


class SessionGateway:
    def __init__(self, router: Router, codec: ChatCodec, config: GatewayConfig | None = None,
                 reward: RewardFunction | None = None, metrics: GatewayMetrics | None = None) -> None:
        self.router = router
        self.codec = codec
        self.config = config or GatewayConfig()
        self.reward = reward
        self.metrics = metrics or GatewayMetrics()
        self.sessions = SessionTable(self.config.limits)
        self.parser = make_parser(self.config.tool_parser)
        self._stop_ids = tuple(dict.fromkeys((*codec.eos_token_ids, *stop_token_ids(self.parser, codec.encode))))
        # a template with a thinking mode renders each chain with the mode its first request asked for
        self._codecs: dict[bool | None, ChatCodec] = {None: codec}
        if codec.thinking_switch:
            self._codecs |= {True: codec.with_thinking(True), False: codec.with_thinking(False)}
        self._encoders = {mode: PromptEncoder(c) for mode, c in self._codecs.items()}
        self._fields_seen: set[str] = set()
        self._engines_checked = False

    async def check_engines(self) -> bool:
        """Refuse engines that cannot serve what the config asks of every turn (RoutingUnavailableError, naming
        them, as the agent loops' check: agent/routing_check.py), among the servers that answer; whether one did
        (until then the check is made again before each request)."""
        if not self.config.return_routed_experts or self._engines_checked:
            return True
        infos = (await self.router.fleet.server_info()).responses
        check_engine_routing(infos)
        self._engines_checked = bool(infos)
        return self._engines_checked

    @property
    def paused(self) -> bool:
        """Whether the trainer has the engines paused through this gateway's Router (``when_paused: retry``
        answers 503 then; a trainer in another process pauses the engines themselves, which hold the request)."""
        return self.router.fleet.paused

    # -- sessions ------------------------------------------------------------------------------------------

    def create(self, spec: SessionSpec) -> Session:
        session = self.sessions.create(spec)
        self._count_sessions()
        return session

    def set_reward(self, session_id: str, reward: float, metrics: dict[str, float] | None = None) -> None:
        session = self.sessions.get(session_id)
        session.reward, session.reward_metrics = reward, dict(metrics or {})

    def fail(self, session_id: str, error: str, cause: str) -> None:
        """Mark every chain of the session failed by the infrastructure (its agent crashed or timed out: ``cause``
        says which): its trajectories are kept for the record and never trained on."""
        for chain in self.sessions.get(session_id).chains:
            if chain.ended is not Termination.ERROR:
                chain.fail(error, infrastructure=True, cause=cause)

    async def finish(self, session_id: str) -> tuple[Session, list[Trajectory]]:
        """The session's trajectories, one per chain (reward: the session's, else the reward function's with its
        ground truth); the session is gone afterwards."""
        session = self.sessions.pop(session_id)
        self.router.close_session(session.id)  # its turns are over: the Router may forget where they went
        self._count_sessions()
        trajectories = []
        for chain in session.chains:
            try:
                reward, metrics = await self._reward(session, chain)
            except Exception as error:  # noqa: BLE001 - a user's reward function that raises fails its chain alone
                chain.fail(f"the reward function raised {type(error).__name__}: {error}", infrastructure=True,
                           cause="reward_function")
                reward, metrics = 0.0, {}
            trajectories.append(chain.trajectory(self._codecs[chain.thinking], reward, metrics, drift_check=True))
        return session, trajectories

    async def _reward(self, session: Session, chain: Chain) -> tuple[float, dict[str, float]]:
        if session.reward is not None:
            return session.reward, session.reward_metrics
        if self.reward is None or chain.ended is Termination.ERROR or not chain.builder.messages:
            return 0.0, {}
        messages = tuple(chain.builder.messages)
        sample = Sample(sample_id=chain.builder.sample_id, messages=(_plain(messages[0]),),
                        ground_truth=session.spec.ground_truth, group_id=session.spec.group_id)
        result = await score(self.reward, Outcome(
            sample=sample, messages=messages, termination=Termination.STOP, tool_instance_rewards={},
            tool_step_rewards=(), interaction_score=None, response_ids=tuple(chain.builder.response_ids),
        ))
        return result.reward, dict(result.metrics)

    def _count_sessions(self) -> None:
        self.metrics.sessions.set(len(self.sessions))
        self.metrics.expired.set(self.sessions.expired)

    # -- turns ---------------------------------------------------------------------------------------------

    async def chat(self, session_id: str, request: ChatRequest) -> ChatReply:
        reply = None
        async for event in self.chat_stream(session_id, request):
            if isinstance(event, ChatReply):
                reply = event
        assert reply is not None  # chat_stream always ends with its reply or raises
        return reply

    async def chat_stream(self, session_id: str, request: ChatRequest) -> AsyncGenerator[TextDelta | ChatReply, None]:
        """TextDeltas (when the request streams: a turn offered tools streams the content before its calls) and then
        the ChatReply, whose content starts with what the deltas held."""
        # 1. the engines checked once, the session and its bounds; what the request held that the gateway ignores,
        # recorded
        if not self._engines_checked:
            try:
                await self.check_engines()
            except RoutingUnavailableError as error:
                raise GatewayError(str(error), status=502, kind="infrastructure") from None
        session = self.sessions.get(session_id, create=True)
        self._count_sessions()
        thinking = request.thinking if request.thinking in self._codecs else None
        self._note_ignored(session, (*request.ignored, *(("thinking",) if request.thinking and thinking is None
                                                          else ())))
        limits = self.config.limits
        if session.in_flight >= limits.max_concurrent_per_session:
            raise GatewayError(f"session {session_id} has max_concurrent_per_session="
                               f"{limits.max_concurrent_per_session} requests in flight", status=429,
                               kind="rate_limit")
        if self.paused and self.config.when_paused == "retry":
            raise GatewayError("the engines are paused for a weight update; retry", status=503, kind="unavailable",
                               retry_after_s=self.config.retry_after_s)
        with TurnLease(session) as lease:
            try:
                # 2. the chain this request appends to, or a new one (listed at once: a request beside it forks)
                chain, pending, new_chain = self._place(session, request, thinking)
                lease.hold(chain, new_chain)
                # 3. sampling, within the chain's budget and the room its context has left
                forced = session.spec.sampling or self.config.sampling
                left = min(chain.budget_left(forced.response_budget) - pending.tokens(), self._room(chain, pending))
                if left <= 0:
                    if not new_chain:
                        chain.ended = Termination.LENGTH
                    empty = self._empty_reply(request, chain, new_chain)
                    lease.release()
                    yield empty
                    return
                spec = self._turn_spec(session, chain, pending, request, left, forced)
                # 4. the turn
                started = time.monotonic()
                out: TurnOutput | None = None
                async for event in TurnRun(self.router, self.codec, spec, frozenset(self._stop_ids)).run():
                    if isinstance(event, TurnOutput):
                        out = event
                    elif request.stream:
                        yield event
                assert out is not None
                # 5. the reply, and the turn committed
                reply = self._reply(request, chain, pending, new_chain, out, time.monotonic() - started,
                                    forced=spec.structured_output is not None)
                lease.commit()
                self.metrics.turns.inc()
                lease.release()
                yield reply
            except InfrastructureError as error:
                if lease.chain is not None:  # kept, failed: the record says the engines lost it, never trained on
                    lease.chain.fail(f"the engines failed the turn: {error}", infrastructure=True, cause=error.cause)
                self.metrics.infrastructure_failures.inc()
                raise GatewayError(f"the engines could not serve the turn ({error})", status=502,
                                   kind="infrastructure") from None
            except RequestError as error:
                raise GatewayError(f"the engine refused the request: {error.details}", status=400) from None

    def _note_ignored(self, session: Session, names: tuple[str, ...]) -> None:
        """Recorded in the session (its JSON), counted by name, and logged the first time this gateway sees one."""
        session.note_ignored(names)
        for name in names:
            label = name if name in self._fields_seen or len(self._fields_seen) < MAX_IGNORED_FIELDS else OTHER_FIELD
            if label not in self._fields_seen:
                self._fields_seen.add(label)
                log.info("gateway: accepted and ignored %s (first seen in session %s)", label, session.id)
            self.metrics.ignored.labels(label).inc()

    def _room(self, chain: Chain, pending: PendingTurn) -> int:
        """New tokens the context has room for after the turn's prompt. A prompt past the context is given one,
        so the engine refuses it with its own error naming both lengths."""
        context = self.router.fleet.max_model_len
        if context is None:  # no server has told its length yet: the engine bounds the turn
            return 2**31 - 1
        prompt = len(chain.builder.context_ids) + pending.tokens()
        return 1 if prompt > context else context - prompt

    def _place(self, session: Session, request: ChatRequest,
               thinking: bool | None) -> tuple[Chain, PendingTurn, bool]:
        key = tools_key(request.tools)
        reason = None
        for chain in reversed(session.chains):
            if chain.ended is not None:
                why = f"chain {chain.index} ended ({chain.ended.value})"
            elif chain.busy:
                why = f"chain {chain.index} has a request in flight (requests at once)"
            elif chain.tools_key != key:
                why = f"the tools offered differ from chain {chain.index}'s"
            elif chain.thinking != thinking:
                why = f"the thinking mode asked for differs from chain {chain.index}'s"
            else:
                found = match(chain.seen, request.messages)
                if found.appends:
                    return chain, chain.pending(self._codecs[thinking], request.messages, found.new), False
                why = f"chain {chain.index}: {found.reason}"
            reason = reason or why  # the latest chain's reason is the one recorded
        index = session.next_chain
        session.next_chain += 1
        chain, pending = Chain.start(index, self._encoders[thinking], session.chain_sample_id(index),
                                     session.spec.group_id, request.messages, request.tools)
        chain.thinking = thinking
        if reason is not None:
            session.forks.append(Fork(index, reason))
            self.metrics.forks.inc()
        return chain, pending, True

    def _turn_spec(self, session: Session, chain: Chain, pending: PendingTurn, request: ChatRequest,
                   left: int, forced: ForcedSampling) -> TurnSpec:
        cap = forced.max_tokens_per_turn
        max_new = min(request.max_tokens or cap, cap, left)
        temperature = forced.temperature if forced.temperature is not None else request.temperature
        top_p = forced.top_p if forced.top_p is not None else request.top_p
        sampling = SamplingParams(
            max_new_tokens=max_new,
            temperature=1.0 if temperature is None else temperature,
            top_p=1.0 if top_p is None else top_p,
            seed=request.seed,
            stop_token_ids=self._stop_ids,
            logprobs=True,  # always recorded: trajectories need them
            top_logprobs=request.top_logprobs if request.logprobs else 0,
            return_routed_experts=self.config.return_routed_experts,
        )
        prompt, media = chain.turn_prompt(pending)
        return TurnSpec(
            session_key=session.id, group_id=session.spec.group_id, prompt_ids=prompt, media=media, sampling=sampling,
            structured_output=self._constraint(request), stop_strings=request.stop,
            timeout_s=self.config.generate_timeout_s, max_resumes=self.config.max_resumes,
            stream_text=request.stream, logprobs=request.logprobs,
            settled=self.parser.settled_content if self._parses_calls(request) else None,
        )

    @staticmethod
    def _parses_calls(request: ChatRequest) -> bool:
        return bool(request.tools) and request.tool_choice != "none"

    def _constraint(self, request: ChatRequest) -> StructuredOutput | None:
        """A grammar that forces calls, for tool_choice required or a named function."""
        choice = request.tool_choice
        if not request.tools or choice in ("auto", "none"):
            return None
        tools = list(request.tools)
        if isinstance(choice, dict):
            tools = [t for t in tools if t["function"]["name"] == choice.get("name")]
            if not tools:
                raise GatewayError(f"tool_choice names {choice.get('name')!r}, which is not among the tools",
                                   param="tool_choice")
        try:
            return StructuredOutput("ebnf_grammar", self.parser.constraint(tools, 1 if isinstance(choice, dict)
                                                                            else len(tools)))
        except ValueError as error:
            raise GatewayError(f"tool_choice {choice!r} needs a grammar, and {error}", param="tool_choice") from None

    def _reply(self, request: ChatRequest, chain: Chain, pending: PendingTurn, new_chain: bool, out: TurnOutput,
               seconds: float, forced: bool) -> ChatReply:
        parsed = self.parser.parse(out.visible) if self._parses_calls(request) else ParsedTurn(out.visible)
        calls = tuple(
            {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
             "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
            for c in parsed.calls
        )
        content = parsed.content + "".join(e.raw for e in parsed.errors)  # a malformed call is shown as written
        finish: FinishReason = "length" if out.finish_reason.value == "length" else "tool_calls" if calls else "stop"
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = list(calls)
        chain.commit(pending, out, message, finish, len(parsed.errors), forced=forced)
        return ChatReply(
            id=f"chatcmpl-{uuid.uuid4().hex}", model=request.model or self.config.model, content=content,
            tool_calls=calls, finish_reason=finish, token_ids=tuple(out.token_ids),
            logprobs=token_logprobs(self.codec, out, 0, len(out.token_ids), frozenset(self._stop_ids))
            if request.logprobs else (),
            prompt_tokens=out.prompt_tokens, completion_tokens=len(out.token_ids),
            cached_prompt_tokens=out.cached_prompt_tokens, created=int(time.time()), chain=chain.index,
            forked=new_chain and chain.index > 0, extra={"seconds": round(seconds, 4)},
        )

    def _empty_reply(self, request: ChatRequest, chain: Chain, new_chain: bool) -> ChatReply:
        """The answer when the chain's response budget is spent: no turn, finish_reason length."""
        return ChatReply(
            id=f"chatcmpl-{uuid.uuid4().hex}", model=request.model or self.config.model, content="", tool_calls=(),
            finish_reason="length", token_ids=(), logprobs=(), prompt_tokens=0, completion_tokens=0,
            created=int(time.time()), chain=chain.index, forked=new_chain and chain.index > 0,
        )


def _plain(message: dict[str, Any]) -> dict[str, Any]:
    """A message as a Sample takes it (role and content only)."""
    content = message.get("content")
    return {"role": message.get("role", "user"), "content": content if isinstance(content, (str, list)) else ""}
