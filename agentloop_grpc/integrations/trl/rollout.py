"""AgentLoopRollout: TRL's ``rollout_func`` backed by our agent loops, engines and tool servers.

``GRPOTrainer(rollout_func=rollout, reward_funcs=[agentloop_reward], ...)`` hands it the prompts of a training
step, each repeated ``num_generations`` times in a row (TRL's RepeatSampler); every run of identical prompts
becomes one GRPO group of Samples, the manager rolls them out (the tool loop through the Router and the tool
server, several turns), and the trajectories go back as TRL's fields (``fields.py``), token-exactly.

The trainer calls synchronously; the manager, its channels and tokenizer live on one background event loop for
the whole run (``BackgroundLoop``). A dataset row is found from its prompt: TRL passes the prompt only, so the
rows the trainer's dataset was built from (``prompt_dataset``) are indexed by their messages.

An agent of your own (``agent=``, the rollout config's ``agent:`` section) plays the samples instead of our loops:
each sample is a session of the session gateway served in this process over the manager's Router (so weight
pushes, pauses and failover are the loops'), and the session's main chain is the sample's completion; TRL takes one
completion per prompt, so the chains an agent forked are counted (``forked_chains``) and not trained on.

Fully-async (``max_staleness`` set; ``AsyncAgentLoopRollout``): the same rollout function over a streaming source
(``streamed_groups.py``) instead of the step's prompts: training steps take finished groups of a ``GroupStream``
that keeps the engines busy while the trainer trains, admitted while the trainer is at most ``max_staleness``
versions ahead of them; evaluation still rolls out the prompts asked.

Weights and versions: one ``VersionClock`` (version_clock.py) says which version step s's weights are (the engines'
version at start plus the steps since the run's first one, so versions only go up, also on a resumed trainer);
``push_weights`` sends the trainer model's parameters to every engine as that version, so the next tokens record
it, and moves the clock, which the stream admits by; ``WeightSyncCallback`` calls it after every optimizer step.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.metadata
import json
import logging
import statistics
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentloop_grpc.agent import AgentLoopConfig, AgentLoopManager, Sample, Trajectory, WorkerSpec
from agentloop_grpc.agent.loops.base import BUILTIN_LOOPS
from agentloop_grpc.agent.metrics import RolloutMetrics
from agentloop_grpc.agent.row_sample import row_sample
from agentloop_grpc.agent.spec import load_codec

from ..background_loop import BackgroundLoop
from ..external_agent import ExternalAgent
from ..gateway_player import GatewayPlayer
from ..group_stream import GroupStream
from ..logprob_check import LogprobDiff, compare
from ..version_clock import VersionClock
from .fields import trl_fields
from .streamed_groups import StreamedGroups
from .weights import model_tensors

#: TRL's rollout_func is experimental: the version this integration is tested with (the ``trl`` extra pins it).
TESTED_TRL_VERSION = "1.16.0"

log = logging.getLogger(__name__)


def prompt_key(messages: Sequence[Mapping[str, Any]]) -> str:
    """A prompt's identity: its messages without the None fields a ``datasets`` table adds for missing keys."""
    return json.dumps([{k: v for k, v in m.items() if v is not None} for m in messages], sort_keys=True)


def prompt_dataset(rows: Sequence[Mapping[str, Any]]):
    """A ``datasets.Dataset`` with TRL's ``prompt`` column (the rows' messages) and their ground truth."""
    from datasets import Dataset

    return Dataset.from_list([
        {"prompt": list(row["messages"]), "ground_truth": None if row.get("ground_truth") is None
         else str(row["ground_truth"])}
        for row in rows
    ])


@dataclass
class StepRecord:
    """One rollout of the training run: its trajectories and what they say."""

    step: int
    trajectories: tuple[Trajectory, ...]
    rollout_s: float
    metrics: dict[str, float] = field(default_factory=dict)


class AgentLoopRollout:
    """TRL's ``rollout_func`` (see the module docstring). Use as a context manager, or call ``start``/``close``."""

    def __init__(
        self,
        spec: WorkerSpec,
        rows: Sequence[Mapping[str, Any]],
        *,
        num_workers: int = 1,
        default_loop: str = "tool",
        ground_truth_kwargs: Sequence[str] = ("check_answer",),
        check_logprobs: int = 4,
        ready_timeout_s: float = 300.0,
        keep_steps: int = 16,
        agent: ExternalAgent | None = None,
        max_staleness: int | None = None,
        seed: int = 0,
    ) -> None:
        """``rows``: the dataset rows (``messages``, optional ``ground_truth``, ``tools``, ``tools_kwargs``,
        ``loop``, ``interaction``), as ``agentloop rollout`` reads them. ``default_loop``: the loop of rows that
        name none (ValueError when a row's loop is neither built in nor one of ``spec.loops``).
        ``ground_truth_kwargs``: tools that get ``{"ground_truth": row.ground_truth}`` at CreateInstance.
        ``check_logprobs``: trajectories per step whose engine logprobs are compared with a recompute by the
        trainer's model (0: none). ``keep_steps``: rollouts kept in ``history`` (the oldest go first: a long run
        must not hold every trajectory it made). ``agent``: an agent of your own plays the samples (see the module
        docstring); its program is checked here (AgentConfigError), before anything starts. ``max_staleness``:
        fully-async training (None: synchronous), the versions a trained group may lag the trainer (0: a step's
        groups start only once the previous step's weights are on the engines); ``seed``: the stream's dataset
        order."""
        self.spec = spec
        self.agent = agent if agent is None else trainer_sampling(agent, spec.loop)
        if agent is not None and agent.reward == "function" and spec.reward is None:
            raise ValueError("agent.reward: function scores with spec.reward, which is not set")
        self._players = GatewayPlayer(self.agent, spec.reward) if self.agent is not None else None
        self.num_workers = num_workers
        self.default_loop = default_loop
        self.ground_truth_kwargs = tuple(ground_truth_kwargs)
        self.check_logprobs = check_logprobs
        self.ready_timeout_s = ready_timeout_s
        self._rows: dict[str, Mapping[str, Any]] = {}
        known = {*BUILTIN_LOOPS, *spec.loops}
        for row in rows:
            loop = row.get("loop") or default_loop
            if loop not in known:  # found here, not as one KeyError per trajectory in every step
                raise ValueError(f"no loop named {loop!r} (row {row.get('id', '?')}); known: {sorted(known)}")
            key = prompt_key(row["messages"])
            if key in self._rows and _without_id(self._rows[key]) != _without_id(row):
                raise ValueError(f"two dataset rows have the same prompt but differ: {row.get('id', key[:80])}")
            self._rows.setdefault(key, row)
        self._loop: BackgroundLoop | None = None
        self._manager: AgentLoopManager | None = None
        #: offered tool names -> the compiled call grammar, for the logprob check's replay (None: nothing to replay)
        self._grammars: Callable[[tuple[str, ...] | None], Any] | None = None
        self._calls = 0
        self._forked_seen = 0
        self.placeholder_id = 0
        #: The trainer's version, read by the rollouts, the stream and the weight pushes.
        self.clock = VersionClock(max_staleness or 0)
        self._streamed = None if max_staleness is None else StreamedGroups(
            list(self._rows.values()), self._sample, self._run_group, self.clock, seed)
        self.history: deque[StepRecord] = deque(maxlen=keep_steps)
        #: The engines the last weight push left out (they did not answer).
        self.left_out: frozenset[str] = frozenset()

    # -- lifecycle --------------------------------------------------------------------------------------------
    def __enter__(self) -> AgentLoopRollout:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.close()

    def start(self) -> AgentLoopRollout:
        """Start the manager on the background loop, wait for every engine, refuse a tokenizer mismatch."""
        if self._loop is not None:
            return self
        installed = importlib.metadata.version("trl")
        if installed != TESTED_TRL_VERSION:
            log.warning("trl %s is installed; this integration is tested with trl %s (rollout_func is experimental)",
                        installed, TESTED_TRL_VERSION)
        self._loop = BackgroundLoop("agentloop-trl")
        try:
            self._loop.run(self._start())
        except BaseException:
            self.close()
            raise
        return self

    async def _start(self) -> None:
        manager = self._manager = AgentLoopManager(self.spec, num_workers=self.num_workers)  # close() stops it
        await manager.start()
        servers = len(manager.control.servers)
        await manager.control.wait_ready(min_servers=servers, timeout_s=self.ready_timeout_s)
        await manager.check_tokenizer()
        infos = list((await manager.control.server_info()).raise_for_errors().responses.values())
        self.clock.start(max(int(info.weight_version) for info in infos))
        codec = await asyncio.to_thread(load_codec, self.spec.model_dir)
        tokenizer = codec.tokenizer
        self.placeholder_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if self.spec.loop.constrain_tool_calls and self.spec.tool_server and self.check_logprobs:
            self._grammars = await self._grammar_compiler(codec, infos[0].vocab_size)
        if self._players is not None:
            await self._players.start(manager.router, self.spec.model_dir, self.spec.loop)

    async def _grammar_compiler(self, codec, vocab_size: int) -> Callable[[tuple[str, ...] | None], Any]:
        """A function: offered tool names -> the call grammar the loops constrained those turns with, compiled
        for the replay (the grammar depends on the tools a sample was offered: each name is a choice in it)."""
        import xgrammar

        from agentloop_grpc.tools.client import GrpcToolClient

        tools = GrpcToolClient(self.spec.tool_server, security=self.spec.tool_security)
        try:
            specs = {s.name: s.openai() for s in await tools.list_tools()}
        finally:
            await tools.close()
        compiler = xgrammar.GrammarCompiler(xgrammar.TokenizerInfo.from_huggingface(codec.tokenizer,
                                                                                    vocab_size=vocab_size))
        compiled: dict[tuple[str, ...], Any] = {}

        def grammar(names: tuple[str, ...] | None) -> Any:
            key = tuple(sorted(specs if names is None else names))
            if key not in compiled:
                compiled[key] = compiler.compile_grammar(call_grammar(self.spec.loop, [specs[n] for n in key]))
            return compiled[key]

        return grammar

    def close(self) -> None:
        if self._loop is None:
            return
        self.close_stream()
        if self._players is not None:  # the gateway first: it generates through the manager's Router
            self._loop.run(self._players.close())
        if self._manager is not None:
            self._loop.run(self._manager.close())
            self._manager = None
        self._loop.close()
        self._loop = None

    @property
    def base_version(self) -> int:
        """The engines' weight version when the run started (the clock's base)."""
        return self.clock.base

    @property
    def manager(self) -> AgentLoopManager:
        if self._manager is None:
            raise RuntimeError("the rollout is not started (use it as a context manager, or call start())")
        return self._manager

    # -- TRL's rollout_func -----------------------------------------------------------------------------------
    def __call__(self, prompts: list, trainer) -> dict[str, list]:
        """Roll out ``prompts`` (TRL's per-process slice, groups of ``num_generations`` identical prompts), or,
        fully-async and training, take as many finished groups of the stream."""
        if self._loop is None:
            self.start()
        assert self._loop is not None  # started above
        training = trainer.model.training
        group_size = trainer.num_generations if training else trainer.num_generations_eval
        step = int(trainer.state.global_step)
        version = self.clock.version_of(step)
        started = time.monotonic()
        if self._streamed is not None and training:
            if group_size < 1 or len(prompts) % group_size:
                raise ValueError(f"{len(prompts)} prompts do not split into groups of num_generations={group_size}")
            stream = self._streamed.stream or self.open_stream(group_size, len(prompts) // group_size)
            self._advance_to(version)  # the trainer is at this step: its groups may start
            groups = self._loop.run(stream.take(len(prompts) // group_size))
            trajectories = tuple(t for g in groups for t in g.trajectories)
            rollout = RolloutMetrics.of(trajectories, time.monotonic() - started)
            extra = self._streamed.metrics(trajectories, version)
            offered = {t.sample_id: s.tools for g in groups for s, t in zip(g.samples, g.trajectories, strict=True)}
            checked: int | None = version  # on the tokens the trainer's weights made (older ones differ by design)
        else:
            samples = self.samples(prompts, group_size, f"s{step}.{self._calls}")
            self._calls += 1
            batch = self._loop.run(self.manager.generate(samples, player=self._players, rows=self.rows_of(samples)))
            trajectories, rollout, extra, checked = batch.trajectories, batch.metrics, {}, None
            offered = {sample.sample_id: sample.tools for sample in samples}
        record = StepRecord(step, trajectories, time.monotonic() - started)
        record.metrics = {**step_metrics(trajectories, rollout, version), **extra}
        if self._players is not None:
            record.metrics["forked_chains"] = float(self._players.forked_chains - self._forked_seen)
            self._forked_seen = self._players.forked_chains
        if self.check_logprobs and training:
            record.metrics.update(self._check_logprobs(trainer, trajectories, offered, checked))
        self.history.append(record)
        return trl_fields(trajectories, self.placeholder_id)

    def _sample(self, row: Mapping[str, Any], sample_id: str, group_id: str) -> Sample:
        return row_sample(row, sample_id, group_id, self.default_loop, self.ground_truth_kwargs)

    async def _run_group(self, samples: Sequence[Sample]):
        return await self.manager.generate(samples, player=self._players, rows=self.rows_of(samples))

    # -- the stream (fully-async) -----------------------------------------------------------------------------
    @property
    def stream(self) -> GroupStream | None:
        """The open stream of groups (None before ``open_stream`` or the first training call, or synchronous)."""
        return None if self._streamed is None else self._streamed.stream

    def open_stream(self, group_size: int, groups_per_step: int) -> GroupStream:
        """Start the stream of groups of ``group_size`` (admitting ``groups_per_step`` per trainer version, from
        the clock's version now); a consumer drives it on this rollout's loop (``advance``, ``take``)."""
        if self._streamed is None:
            raise RuntimeError("a synchronous rollout has no stream (set max_staleness)")
        self.start()
        assert self._loop is not None  # started
        return self._loop.run(self._streamed.open(group_size, groups_per_step))

    def stream_metrics(self, trajectories: Sequence[Trajectory], version: int) -> dict[str, float]:
        """The stream's metrics of a step that trained ``trajectories`` at ``version``: staleness, queue, idle
        seconds since the last step (``StreamedGroups.metrics``)."""
        if self._streamed is None:
            raise RuntimeError("a synchronous rollout has no stream (set max_staleness)")
        return self._streamed.metrics(trajectories, version)

    def close_stream(self) -> None:
        """Stop admitting and cancel the groups still rolling out (the manager stays up)."""
        if self._streamed is not None and self._loop is not None:
            self._loop.run(self._streamed.close())

    def submit(self, coroutine) -> concurrent.futures.Future:
        """Start ``coroutine`` on this rollout's loop (where the stream lives) without waiting."""
        if self._loop is None:
            coroutine.close()
            raise RuntimeError("the rollout is not started")
        return self._loop.submit(coroutine)

    def advance(self, trained_versions: int) -> None:
        """The engines now hold the trainer's weights after ``trained_versions`` updates of this run."""
        self._advance_to(self.clock.base + trained_versions)

    def _advance_to(self, version: int) -> None:
        if self._loop is not None:
            self._loop.run(_advance(self.clock, self.stream, version))

    def rows_of(self, samples: Sequence[Sample]) -> list[Mapping[str, Any]]:
        """Each sample's dataset row (what an agent of your own gets, with the sample's fields)."""
        return [self._rows[prompt_key(s.messages)] for s in samples]

    def samples(self, prompts: Sequence[Sequence[Mapping[str, Any]]], group_size: int, prefix: str) -> list[Sample]:
        """One Sample per prompt; a run of ``group_size`` identical prompts is one group."""
        if group_size < 1 or len(prompts) % group_size:
            raise ValueError(f"{len(prompts)} prompts do not split into groups of num_generations={group_size}")
        samples = []
        for g in range(len(prompts) // group_size):
            group = prompts[g * group_size : (g + 1) * group_size]
            key = prompt_key(group[0])
            if any(prompt_key(p) != key for p in group[1:]):
                raise ValueError(f"prompts {g * group_size}..{(g + 1) * group_size - 1} are not one prompt repeated "
                                 "num_generations times (TRL's RepeatSampler order)")
            row = self._rows.get(key)
            if row is None:
                raise KeyError(f"prompt {key[:120]}... is not in the rows given to AgentLoopRollout")
            for k in range(group_size):
                samples.append(row_sample(row, f"{prefix}/{g}/{k}", f"{prefix}/{g}", self.default_loop,
                                          self.ground_truth_kwargs))
        return samples

    def _check_logprobs(self, trainer, trajectories: Sequence[Trajectory],
                        offered: Mapping[str, tuple[str, ...] | None], version: int | None = None) -> dict[str, float]:
        """Engine logprobs against the trainer model's recompute on the first scorable trajectories (``version``:
        only their tokens made by that weight version, the trainer's)."""
        import torch

        from .routing_replay import trajectory_replay  # torch and transformers: loaded when a trainer checks

        chosen = [t for t in trajectories if not t.failed and t.model_tokens
                  and (version is None or version in t.weight_versions)][: self.check_logprobs]
        if not chosen:
            return {}
        model = trainer.accelerator.unwrap_model(trainer.model)
        temperature = self.spec.loop.sampling.temperature
        # routing replay (the loops recorded routing for it): the recompute routes as the training forward does,
        # and the policy difference without it says what replay saves
        replay = (lambda t: trajectory_replay(model, t)) if any(t.routed_experts is not None for t in chosen) else None
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                grammars = self._grammars
                grammar = None if grammars is None else (lambda t: grammars(offered[t.sample_id]))
                policy, sampler = compare(model, chosen, temperature, grammar, version, replay)
                native = compare(model, chosen, temperature, None, version)[0] if replay is not None else None
        finally:
            model.train(was_training)
        return {**_diff("logprob_diff_policy", policy), **_diff("logprob_diff_sampler", sampler),
                **(_diff("logprob_diff_policy_unreplayed", native) if native is not None else {})}

    # -- weights ----------------------------------------------------------------------------------------------
    def push_weights(self, model, step: int) -> float:
        """Send ``model``'s trainable parameters to every engine that answers as the weights of optimizer step
        ``step`` (the clock's version of that step; those that do not are in ``left_out``); return the seconds it
        took."""
        started = time.monotonic()
        tensors = model_tensors(model)
        version = self.clock.version_of(step)
        # an engine that died is left out (the Router has failed its work over): training goes on with the others
        self.left_out = self._loop.run(self.manager.update_weights(tensors, version, leave_out_unreachable=True))
        self._advance_to(version)
        return time.monotonic() - started

    def engine_versions(self) -> dict[str, int]:
        """The weight version now of each engine server that answers (InfrastructureError when none does)."""
        infos = self._loop.run(self.manager.control.server_info())
        if not infos.responses:
            infos.raise_for_errors()
        return {address: int(info.weight_version) for address, info in infos.responses.items()}


async def _advance(clock: VersionClock, stream: GroupStream | None, version: int) -> None:
    """On the rollout's loop, where the stream reads the clock: move it, and wake the stream when it moved."""
    if clock.advance(version) and stream is not None:
        stream.wake()


def trainer_sampling(agent: ExternalAgent, loop: AgentLoopConfig) -> ExternalAgent:
    """``agent`` with the gateway forcing the loop's temperature and top_p where it forces none: TRL's loss
    describes the engines' sampling by the trainer's temperature (the loop's), whatever an agent asks for."""
    forced = agent.gateway.sampling
    sampling = forced.model_copy(update={
        "temperature": loop.sampling.temperature if forced.temperature is None else forced.temperature,
        "top_p": loop.sampling.top_p if forced.top_p is None else forced.top_p})
    return agent.model_copy(update={"gateway": agent.gateway.model_copy(update={"sampling": sampling})})


def _without_id(row: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k != "id"}


def _diff(prefix: str, diff: LogprobDiff) -> dict[str, float]:
    return {f"{prefix}_mean": diff.mean_abs, f"{prefix}_max": diff.max_abs, f"{prefix}_tokens": float(diff.tokens)}


def step_metrics(trajectories: Sequence[Trajectory], rollout: RolloutMetrics, version: int) -> dict[str, float]:
    """What a training step's rollout says about the policy (scorable trajectories only) and its cost."""
    ok = [t for t in trajectories if not t.failed]
    groups: dict[str, list[float]] = {}
    for t in ok:
        groups.setdefault(t.group_id, []).append(t.reward)
    flat = [g for g in groups.values() if len(g) > 1 and statistics.pstdev(g) == 0.0]
    versions = [v for t in ok for v, m in zip(t.weight_versions, t.response_mask, strict=True) if m]
    return {
        "reward_mean": rollout.mean_reward,
        "correct_rate": rollout.correct_rate,
        "valid_call_rate": rollout.valid_tool_call_rate,
        "assistant_turns": rollout.mean_assistant_turns,
        "model_tokens": float(rollout.model_tokens),
        "trajectories": float(len(trajectories)),
        "failures": float(rollout.failures),
        "infrastructure_failures": float(rollout.infrastructure_failures),
        **{f"infrastructure_failures/{cause}": float(n) for cause, n in rollout.infrastructure_causes.items()},
        "frac_groups_zero_std": len(flat) / len(groups) if groups else 0.0,
        "rollout_s": rollout.wall_s,
        # tokens made by weights other than the trainer's current ones (0 when every push landed)
        "stale_tokens": float(sum(v != version for v in versions)),
    }


def call_grammar(loop: AgentLoopConfig, tools: Sequence[dict[str, Any]]) -> str:
    """The call grammar the loops constrained turns offering ``tools`` with: the run's tool-call format's."""
    from agentloop_grpc.agent.parsers import make_parser

    return make_parser(loop.tool_parser, tools).constraint(tools, loop.max_parallel_tool_calls)
