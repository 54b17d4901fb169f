"""verl's loop-level seam: an agent-loop manager its trainer loads by name, running OUR loops on our engines.

```yaml
actor_rollout_ref:
  rollout:
    agent:
      agent_loop_manager_class: agentloop_grpc.integrations.verl.manager.AgentloopAgentLoopManager
    custom:
      agentloop:
        servers: ["127.0.0.1:50051"]      # or none: the servers verl's load balancer holds (rollout.name=agentloop)
        loops: {}                         # LoopSettings below
    multi_turn:
      tool_config_path: tools.yaml        # verl's tool YAML: served by a launched `agentloop tools serve`
```

verl's trainer calls ``create(config=, llm_client=, teacher_client=, reward_loop_worker_handles=)`` and then
``generate_sequences(batch)`` synchronously from its driver; both are auto-awaited as verl's own manager's are.
Our manager, its channels and tool clients live on one background event loop for the whole run (verl's
auto-await runs each call on a fresh loop, which channels cannot outlive).

Rows -> Samples (``samples_from``): ``raw_prompt`` -> messages (the PIL images of its image parts as PNG bytes);
``agent_name`` -> our loop (``tool_agent`` -> ``tool``, ``single_turn_agent`` -> ``single_turn``; verl's
``agent.default_agent_loop`` when the column is absent; anything else refused by name); ``reward_model.ground_truth``
-> the ground truth (and ``ground_truth`` of the ``ground_truth_tools``' instances);
``tools_kwargs.<tool>.create_kwargs`` -> that tool's CreateInstance arguments; ``extra_info.tool_selection`` -> the
tools offered; ``interaction_kwargs`` -> the interaction ``name`` and its arguments; ``uid`` -> the GRPO group (verl
already repeated each prompt ``rollout.n`` times, interleaved).

Rewards: verl's reward loop workers when the trainer passes them and ``reward`` is not set (verl's reward config,
custom reward function included, scores every trajectory as verl's manager has it do); else our reward function in
the rollout (the metrics it reports for every trajectory become verl's reward extra info). The result is
``to_dataproto``'s batch padded to ``prompt_length``/``response_length``, one row per input row in the input's
order, with verl's manager's meta_info (``timing``, ``reward_extra_keys``). A failed trajectory raises
``FailedTrajectoriesError`` naming it (see ``batch.py`` for why none is dropped or masked).
An agent of your own (``loops.agent``: the rollout config's ``agent:`` section) plays every row instead of our
loops: each row a session of the session gateway served in the driver over the manager's Router, the session's
main chain the row's response; the chains an agent forked are counted (``forked_chains``), not trained on (verl
takes one response per row). Its reward is the session's (``agent.reward: session``) or, with ``function``, what
scores loops' trajectories (``reward``, else verl's reward loop workers).
Weight updates stay verl's (its checkpoint engine reaches our replicas); engines are neither woken nor put to
sleep here: verl's trainer does that around ``generate_sequences``.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import random
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from tensordict import TensorDict
from verl import DataProto
from verl.utils.fs import copy_to_local
from verl.utils.import_utils import resolve_config_path
from verl.utils.ray_utils import auto_await

from agentloop_grpc.agent.config import AgentLoopConfig
from agentloop_grpc.agent.manager import AgentLoopManager
from agentloop_grpc.agent.row_sample import row_sample
from agentloop_grpc.agent.sample import Sample
from agentloop_grpc.agent.spec import ComponentSpec, WorkerSpec, load_codec
from agentloop_grpc.agent.trajectory import Trajectory
from agentloop_grpc.common.media import ImageExpander
from agentloop_grpc.integrations.background_loop import BackgroundLoop
from agentloop_grpc.integrations.external_agent import ExternalAgent
from agentloop_grpc.integrations.gateway_player import GatewayPlayer
from agentloop_grpc.launch.launcher import ServerProcess, agentloop_command
from agentloop_grpc.router import RouterConfig

from .batch import FailedTrajectoriesError, num_turns, to_dataproto
from .picture_spans import encode_picture
from .settings import server_addresses, settings_from

#: verl's agent names (and ours) -> the loop of ours that runs them.
AGENT_LOOPS = {"tool_agent": "tool", "single_turn_agent": "single_turn", "tool": "tool", "single_turn": "single_turn"}
#: The per-tool keys of verl's ``tools_kwargs``; only ``create_kwargs`` has an equivalent (CreateInstance).
_TOOL_KWARGS = ("create_kwargs", "execute_kwargs", "calc_reward_kwargs", "release_kwargs")


class LoopSettings(BaseModel):
    """``rollout.custom.agentloop.loops``: the loop-level manager's settings; unknown keys are refused by name."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tool_server: str | None = None
    """Address of the ToolExecute server the tool loop uses; None: one is launched for verl's
    ``multi_turn.tool_config_path`` (its tool YAML, served out of process), else no tools."""
    tool_server_startup_s: float = Field(120.0, gt=0)
    """How long a launched tool server may take to import its tools and report SERVING."""
    model_dir: str | None = None
    """Folder of the tokenizer the loops encode with; None: verl's ``model.tokenizer_path`` or ``model.path``."""
    workers: int = Field(1, ge=1)
    """Agent-loop workers (each with its own Router over the engines)."""
    use_ray: bool = False
    """Run the workers as Ray actors (verl's Ray cluster) instead of in the driver's background loop."""
    max_concurrency: int = Field(256, ge=1)
    """Loops running at once in one worker."""
    reward: ComponentSpec | None = None
    """Our reward function (``module:attribute``); None: verl's reward loop workers when the trainer passes them,
    else our default (the tool instances' rewards plus the interaction's score)."""
    interactions: dict[str, ComponentSpec] = Field(default_factory=dict)
    """Interactions by the name a row's ``interaction_kwargs.name`` gives."""
    loops: dict[str, ComponentSpec] = Field(default_factory=dict)
    """Your own loops by name (``module:Class`` + its config), beside ``single_turn`` and ``tool``: a row's
    ``agent_name`` may name one."""
    ground_truth_tools: tuple[str, ...] = ("check_answer",)
    """Tools whose instances get ``{"ground_truth": reward_model.ground_truth}`` unless create_kwargs say
    otherwise."""
    loop: dict[str, Any] = Field(default_factory=dict)
    """``AgentLoopConfig`` fields over those derived from verl's rollout config (not the two lengths)."""
    router: RouterConfig = Field(default_factory=RouterConfig)
    """How the workers' Routers spread trajectories over the engines."""
    agent: ExternalAgent | None = None
    """An agent of your own that plays every row instead of our loops (see the module docstring); the gateway
    generates through the first worker's Router, so ``use_ray`` must be false."""

    @model_validator(mode="after")
    def _agent_in_process(self) -> LoopSettings:
        if self.agent is not None and self.use_ray:
            raise ValueError("agent: an agent's sessions run in the driver's process; set use_ray: false")
        return self


def loop_config(rollout: Any, settings: LoopSettings, validate: bool) -> AgentLoopConfig:
    """Our loop limits from verl's rollout config (``validate``: its ``val_kwargs`` sampling) and the overrides."""
    lengths = {"max_prompt_tokens": rollout.get("prompt_length"), "response_budget": rollout.get("response_length")}
    missing = [name for name, value in zip(("prompt_length", "response_length"), lengths.values()) if not value]
    if missing:
        raise ValueError(f"actor_rollout_ref.rollout.{missing[0]} must be set")
    fixed = sorted(set(settings.loop) & set(lengths))
    if fixed:
        raise ValueError(f"loops.loop.{fixed[0]} comes from verl's rollout prompt_length/response_length")
    multi = rollout.get("multi_turn") or {}
    if (multi.get("format") or "hermes") != "hermes":
        raise ValueError(f"actor_rollout_ref.rollout.multi_turn.format {multi.get('format')!r}: our loops parse "
                         "hermes tool calls only")
    derived = {
        "max_assistant_turns": multi.get("max_assistant_turns"),
        "max_parallel_tool_calls": multi.get("max_parallel_calls"),
        "max_tool_response_chars": multi.get("max_tool_response_length"),
        "tool_response_truncation": multi.get("tool_response_truncate_side"),
    }
    source = (rollout.get("val_kwargs") or {}) if validate else rollout
    sampling = {name: source.get(name) for name in ("temperature", "top_p", "top_k")}
    fields = {**lengths, "max_new_tokens_per_turn": lengths["response_budget"],
              **{name: value for name, value in derived.items() if value is not None},
              # verl's user turns: each round of tool responses is one too, and null or 0 is no limit
              "max_user_turns": multi.get("max_user_turns") or None, "count_tool_rounds_as_user_turns": True,
              "sampling": {name: value for name, value in sampling.items() if value is not None}}
    if rollout.get("enable_rollout_routing_replay"):  # verl's R3: its actor replays the routing of the batch
        fields["return_routed_experts"] = True
    return AgentLoopConfig.model_validate({**fields, **settings.loop})


def _column(columns: Mapping[str, np.ndarray], name: str, row: int, default: Any = None) -> Any:
    value = columns[name][row] if name in columns else None
    return default if value is None else value


def _create_kwargs(tools_kwargs: Mapping[str, Any], row: int) -> dict[str, dict[str, Any]]:
    kwargs = {}
    for tool, entry in tools_kwargs.items():
        if entry is None:  # parquet gives every row the union of the rows' tools, None where a row has none
            continue
        if not isinstance(entry, Mapping):
            raise ValueError(f"row {row}: tools_kwargs.{tool} must be a mapping of {list(_TOOL_KWARGS)}")
        unknown = sorted(set(entry) - set(_TOOL_KWARGS))
        unsupported = [key for key in _TOOL_KWARGS[1:] if entry.get(key)]
        if unknown or unsupported:
            raise ValueError(f"row {row}: tools_kwargs.{tool}.{(unknown or unsupported)[0]} has no equivalent "
                             "(tools get create_kwargs at CreateInstance only)")
        kwargs[tool] = dict(entry.get("create_kwargs") or {})
    return kwargs


def _messages(raw_prompt: Sequence[Mapping[str, Any]], row: int) -> list[dict[str, Any]]:
    """verl's ``raw_prompt`` as our messages: the PIL images verl's dataset puts in image parts (``{"type": "image",
    "image": <PIL image>, ...}``) become their PNG bytes, which a Sample carries; other pictures stay as they are."""
    from PIL import Image

    messages = []
    for i, message in enumerate(raw_prompt):
        message = dict(message)
        if isinstance(message.get("content"), list):
            parts = []
            for j, part in enumerate(message["content"]):
                if isinstance(part, Mapping) and isinstance(part.get("image"), Image.Image):
                    picture = encode_picture(part["image"], f"row {row}: raw_prompt[{i}].content[{j}].image")
                    part = {"type": part.get("type"), "image": picture.data}
                parts.append(part)
            message["content"] = parts
        messages.append(message)
    return messages


def _ground_truth(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return str(value) if isinstance(value, (int, float, np.number)) else json.dumps(value, default=str)


def samples_from(batch: DataProto, default_agent: str, ground_truth_tools: Sequence[str] = (),
                 custom_loops: Sequence[str] = ()) -> list[Sample]:
    """Our Samples for verl's rows (see the module docstring); an ``agent_name`` in ``custom_loops`` runs that
    loop of ours. ValueError names the row and the column."""
    loops = {**AGENT_LOOPS, **{name: name for name in custom_loops}}
    columns = batch.non_tensor_batch
    for required in ("raw_prompt", "uid"):
        if required not in columns:
            raise ValueError(f"verl's batch has no {required!r} column (RLHFDataset and the trainer put it there)")
    samples = []
    for i in range(len(batch)):
        agent = str(_column(columns, "agent_name", i, default_agent))
        if agent not in loops:
            raise ValueError(f"row {i}: agent_name {agent!r} has no agentloop loop; known: {sorted(loops)}")
        extra_info = _column(columns, "extra_info", i, {})
        tools_kwargs = _column(columns, "tools_kwargs", i, None) or extra_info.get("tools_kwargs") or {}
        interaction = dict(_column(columns, "interaction_kwargs", i, None) or extra_info.get("interaction_kwargs")
                           or {})
        if interaction and not interaction.get("name"):
            raise ValueError(f"row {i}: interaction_kwargs.name must name the interaction")
        selection = extra_info.get("tool_selection")
        row = {"messages": _messages(columns["raw_prompt"][i], i), "loop": loops[agent],
               "tools_kwargs": _create_kwargs(tools_kwargs, i), "interaction": interaction.pop("name", None),
               "ground_truth": _ground_truth(_column(columns, "reward_model", i, {}).get("ground_truth")),
               "tools": list(selection) if selection else None}
        group = str(columns["uid"][i])
        try:
            sample = row_sample(row, f"{group}/{i}", group, ground_truth_kwargs=ground_truth_tools)
        except ValidationError as error:
            first = error.errors()[0]
            raise ValueError(f"row {i}: {'.'.join(map(str, first['loc']))}: {first['msg']}") from None
        except TypeError as error:
            raise ValueError(f"row {i}: {error}") from None
        samples.append(sample.model_copy(update={"interaction_kwargs": interaction}))
    return samples


def timing_metrics(metrics: Sequence[Mapping[str, float]], data: DataProto) -> dict[str, float]:
    """verl's manager's ``timing`` keys: per phase min/max/mean over the trajectories, and the slowest one's."""
    phases = ("generate_sequences", "tool_calls", "compute_score", "num_preempted")
    values = {phase: np.array([m[phase] for m in metrics], dtype=np.float64) for phase in phases}
    timing = {f"agent_loop/{phase}/{name}": float(getattr(v, name)()) for phase, v in values.items()
              for name in ("min", "max", "mean")}
    slowest = int(np.argmax(values["generate_sequences"] + values["tool_calls"] + values["compute_score"]))
    timing.update({f"agent_loop/slowest/{phase}": float(values[phase][slowest]) for phase in phases})
    p = data.batch["prompts"].size(1)
    attention = data.batch["attention_mask"][slowest]
    timing["agent_loop/slowest/prompt_length"] = int(attention[:p].sum())
    timing["agent_loop/slowest/response_length"] = int(attention[p:].sum())
    return timing


def _one(value: Any) -> np.ndarray:
    array = np.empty(1, dtype=object)
    array[0] = value
    return array


def _scoring_input(columns: Mapping[str, np.ndarray], row: int, trajectory: Trajectory) -> DataProto:
    """One trajectory as verl's reward loop workers take it (unpadded, its row's columns, verl's extra fields).
    The columns are copies, as Ray's serialization makes them: verl's reward managers write into ``extra_info``,
    which the copies of one prompt share."""
    prompt = torch.tensor(trajectory.prompt_ids, dtype=torch.long)
    response = torch.tensor(trajectory.response_ids, dtype=torch.long)
    input_ids = torch.cat([prompt, response])
    tensors = {"prompts": prompt, "responses": response, "input_ids": input_ids,
               "attention_mask": torch.ones_like(input_ids), "position_ids": torch.arange(len(input_ids))}
    non_tensor = {name: _one(copy.deepcopy(values[row])) for name, values in columns.items()}
    non_tensor.update({
        "tool_extra_fields": _one({"turn_scores": list(trajectory.turn_scores),
                                   "tool_rewards": list(trajectory.tool_rewards)}),
        "__num_turns__": np.array([num_turns(trajectory)]),
        "prompt_len": np.array([len(prompt)]),
        "response_len": np.array([len(response)]),
    })
    return DataProto(batch=TensorDict({k: v.unsqueeze(0) for k, v in tensors.items()}, batch_size=1),
                     non_tensor_batch=non_tensor)


class AgentloopAgentLoopManager:
    """verl's ``agent_loop_manager_class``: verl's rows through our AgentLoopManager, back as verl's batch."""

    def __init__(self, config: DictConfig, llm_client: Any, teacher_client: Any = None,
                 reward_loop_worker_handles: Sequence[Any] | None = None) -> None:
        if teacher_client:
            raise ValueError("teacher_client: on-policy distillation is not supported by the agentloop manager")
        self.config = config
        self.llm_client = llm_client
        self.reward_loop_worker_handles = list(reward_loop_worker_handles or [])
        rollout = config.actor_rollout_ref.rollout
        self.settings = LoopSettings.model_validate(settings_from(rollout).loops)
        self.loop = loop_config(rollout, self.settings, validate=False)
        #: Each validation sample's own sampling (verl's val_kwargs): the same workers run both kinds of batch.
        self.val_sampling = loop_config(rollout, self.settings, validate=True).sampling
        self.prompt_length, self.response_length = rollout.prompt_length, rollout.response_length
        self.default_agent = OmegaConf.select(rollout, "agent.default_agent_loop", default="single_turn_agent")
        model = config.actor_rollout_ref.get("model") or {}
        self.model_dir = self.settings.model_dir or model.get("tokenizer_path") or model.get("path")
        multi_turn = rollout.get("multi_turn") or {}
        if multi_turn.get("function_tool_path"):
            raise ValueError("multi_turn.function_tool_path: verl's function tools are not served by agentloop; "
                             "name them in a tool config (agentloop_grpc/tools/README.md)")
        self.tool_config_path = multi_turn.get("tool_config_path")
        #: The tool server the loops use: ``loops.tool_server``, else one launched for ``tool_config_path``.
        self.tool_server = self.settings.tool_server
        self._tools_process: ServerProcess | None = None
        self._background = BackgroundLoop("agentloop-verl")
        self._manager: AgentLoopManager | None = None
        self._engines: tuple[str, ...] = ()
        self._pad_token_id = 0
        self._images: ImageExpander | None = None
        agent = self.settings.agent
        #: Made here: an agent that cannot run fails before any server is asked anything.
        self._players = GatewayPlayer(agent, self.settings.reward) if agent is not None else None

    @classmethod
    @auto_await
    async def create(cls, *args: Any, **kwargs: Any) -> AgentloopAgentLoopManager:
        instance = cls(*args, **kwargs)
        try:
            await instance.start()
        except BaseException:
            instance.close()
            raise
        return instance

    async def start(self) -> None:
        """Find the engine servers and open our manager (checking the engines' tokenizer): a bad address or tool
        server fails here, not at the first validation hours later."""
        self._engines = tuple(await server_addresses(self.config, self.llm_client))
        await asyncio.to_thread(self._background.run, self._open())

    async def _open(self) -> None:
        if self.tool_server is None and self.tool_config_path:
            self.tool_server = await self._launch_tools(resolve_config_path(self.tool_config_path))
        if self.model_dir is not None:  # verl's model paths may be hdfs:// or hub ids: made local as verl does
            self.model_dir = await asyncio.to_thread(copy_to_local, self.model_dir)
        codec = await asyncio.to_thread(load_codec, self.model_dir)
        self._pad_token_id = codec.tokenizer.pad_token_id or 0
        self._images = codec.images  # the processor that makes the pictures' tensors for multi_modal_inputs
        s = self.settings
        spec = WorkerSpec(engines=self._engines, tool_server=self.tool_server, model_dir=self.model_dir, loop=self.loop,
                          router=s.router, max_concurrency=s.max_concurrency, reward=s.reward,
                          interactions=s.interactions, loops=s.loops)
        # kept before start: close() reaches a half-started manager too
        self._manager = AgentLoopManager(spec, num_workers=s.workers, use_ray=s.use_ray)
        await self._manager.start()
        await self._manager.check_tokenizer()
        if self._players is not None:
            await self._players.start(self._manager.router, self.model_dir, self.loop)

    async def _launch_tools(self, config_path: str) -> str:
        """``agentloop tools serve`` for verl's tool YAML: its tools run in that process, which ends with ours."""
        log = Path(tempfile.mkdtemp(prefix="agentloop-verl-")) / "tools.log"
        self._tools_process = ServerProcess([*agentloop_command(), "tools", "serve", "--config", config_path,
                                             "--port", "0"], log, terminate_with_parent=True)
        return await self._tools_process.start(timeout_s=self.settings.tool_server_startup_s)

    @auto_await
    async def generate_sequences(self, prompts: DataProto) -> DataProto:
        """verl's rows in, verl's agent-loop batch out (same length, same order)."""
        validate = bool(prompts.meta_info.get("validate", False))
        do_sample = prompts.non_tensor_batch.get("__do_sample__")
        if do_sample is not None and not validate and not np.all(do_sample):
            raise ValueError("__do_sample__: REMAX's greedy baseline rows are not supported by the agentloop manager")
        samples = samples_from(prompts, self.default_agent, self.settings.ground_truth_tools, list(self.settings.loops))
        return await asyncio.to_thread(self._background.run, self._generate(prompts, samples, validate))

    async def _generate(self, prompts: DataProto, samples: list[Sample], validate: bool) -> DataProto:
        if validate:
            samples = [sample.model_copy(update={"sampling": self.val_sampling}) for sample in samples]
        trajectories = list((await self._manager.generate(samples, player=self._players)).trajectories)
        failed = [(t.sample_id, t.error or t.termination.value) for t in trajectories if t.failed]
        if failed:
            raise FailedTrajectoriesError(failed, len(trajectories))
        columns = dict(prompts.non_tensor_batch)
        agent = self.settings.agent
        if self.reward_loop_worker_handles and self.settings.reward is None and (agent is None or
                                                                                agent.reward == "function"):
            scored = await asyncio.gather(*(self._verl_reward(columns, i, t) for i, t in enumerate(trajectories)))
            trajectories = [t for t, _ in scored]
            reward_extra = [extra for _, extra in scored]
        else:  # our reward ran in the rollout; the metrics every trajectory reports become verl's extra info
            common = sorted(set.intersection(*(set(t.metrics) for t in trajectories)))
            reward_extra = [{key: t.metrics[key] for key in common} for t in trajectories]
        data = to_dataproto(trajectories, self._pad_token_id, self.prompt_length, self.response_length,
                            columns=columns, reward_extra=reward_extra, images=self._images)
        metrics = data.meta_info.pop("metrics")
        data.meta_info = {"timing": timing_metrics(metrics, data), **data.meta_info}
        return data

    @property
    def forked_chains(self) -> int:
        """Chains the agents forked over the run: counted, not trained on."""
        return self._players.forked_chains if self._players is not None else 0

    async def _verl_reward(self, columns: Mapping[str, np.ndarray], row: int,
                           trajectory: Trajectory) -> tuple[Trajectory, dict[str, Any]]:
        """Score one trajectory with one of verl's reward loop workers, as verl's own manager does."""
        started = time.monotonic()
        handle = random.choice(self.reward_loop_worker_handles)
        result = await handle.compute_score.remote(_scoring_input(columns, row, trajectory))
        timings = dataclasses.replace(trajectory.timings, reward_s=time.monotonic() - started)
        scored = dataclasses.replace(trajectory, reward=float(result["reward_score"]), timings=timings)
        return scored, dict(result.get("reward_extra_info") or {})

    def close(self) -> None:
        """Close our manager and the background loop (verl never calls this; tests and scripts do)."""
        if self._players is not None:  # the gateway first: it generates through the manager's Router
            self._background.run(self._players.close())
        manager, self._manager = self._manager, None
        if manager is not None:
            self._background.run(manager.close())
        if self._tools_process is not None:
            self._background.run(self._tools_process.stop(grace_s=5.0))
        self._background.close()


__all__ = ["AGENT_LOOPS", "AgentloopAgentLoopManager", "LoopSettings", "loop_config", "samples_from",
           "timing_metrics"]
