"""RolloutConfig: everything ``agentloop rollout --config FILE.yaml`` needs, with defaults and a docstring per
field. Unknown fields are errors (a typo must not silently fall back to a default)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from agentloop_grpc.agent.config import AgentLoopConfig
from agentloop_grpc.agent.loops.base import BUILTIN_LOOPS
from agentloop_grpc.agent.spec import ComponentSpec, CustomLoops
from agentloop_grpc.client_security import ClientSecurity
from agentloop_grpc.common.yaml_config import load_yaml_config
from agentloop_grpc.engine_adapters.config import EngineConfig
from agentloop_grpc.engine_adapters.config_base import LocalModelConfig
from agentloop_grpc.engine_adapters.embedded.config import EmbeddedEngineConfig
from agentloop_grpc.integrations.external_agent import ExternalAgent
from agentloop_grpc.integrations.verifiers.config import VerifiersEnvironment
from agentloop_grpc.router import RouterConfig
from agentloop_grpc.trackers.config import REPORT_TO_HELP, TrackerName, TrackerSettings, check_report_to

_STRICT = ConfigDict(frozen=True, extra="forbid")


class LaunchEngines(BaseModel):
    """Engine servers this run starts on this machine (one process per data-parallel replica)."""

    model_config = _STRICT

    replicas: int = Field(2, ge=1, le=64, description="Data-parallel replicas (one server process each).")
    engine: EngineConfig = Field(
        default_factory=lambda: EmbeddedEngineConfig(max_running=16),
        description="What every replica serves: one adapter's config, chosen by its kind (see "
        "engine-config.md; default: embedded, max_running 16). dp_rank and dp_size are set per replica; embedded "
        "threads default to the cores / replicas.",
    )
    startup_timeout_s: float = Field(300.0, gt=0, description="How long a replica may take to load.")
    extra_args: tuple[str, ...] = Field(
        (), description="More `agentloop engine serve` options for every replica (server ones, e.g. --log-level)."
    )
    restart_lost: bool = Field(
        False, description="Start a replica whose process exits (a crash, the OOM killer) again, on a new port, and "
        "route to it (the run's Routers follow its discovery.json); a loss is reported either way. In agentloop "
        "train the restarted replica is held out of routing until the next weight push brings it the trainer's "
        "weights."
    )

    @property
    def model_folder(self) -> str | None:
        """The checkpoint folder the replicas serve (None: the default model, or an engine without one)."""
        return self.engine.model if isinstance(self.engine, LocalModelConfig) else None


class Engines(BaseModel):
    """Where generation happens: exactly one of addresses, discovery_file, launch."""

    model_config = _STRICT

    addresses: tuple[str, ...] = Field((), description="Running engine servers (host:port).")
    discovery_file: str | None = Field(None, description="A discovery file written by `agentloop engine launch`.")
    launch: LaunchEngines | None = Field(None, description="Start engine servers for this run, stop them after.")

    @model_validator(mode="after")
    def _one_source(self) -> Engines:
        given = [bool(self.addresses), self.discovery_file is not None, self.launch is not None]
        if sum(given) != 1:
            raise ValueError("engines: give exactly one of addresses, discovery_file or launch")
        return self


class Tools(BaseModel):
    """Where tools run: a running ToolExecute server, or one this run starts from a tools.yaml."""

    model_config = _STRICT

    address: str | None = Field(None, description="A running ToolExecute server (host:port).")
    launch: str | None = Field("builtin", description="A tools.yaml to serve for this run ('builtin': the built-ins).")
    security: ClientSecurity | None = Field(
        None, description="TLS and token of the running server at address (file paths or variable names)."
    )

    @model_validator(mode="after")
    def _one_source(self) -> Tools:
        if self.address is not None and self.launch is not None:
            raise ValueError("tools: give address or launch, not both (set launch: null to use address)")
        if self.security is not None and self.address is None:
            raise ValueError("tools: security is how to reach the running server at address")
        return self


class ArithmeticDataset(BaseModel):
    """The bundled arithmetic tasks, generated from a seed: the demo's multi-step word problems, or one-step
    problems ("What is 14 + 9?", what ``make train`` learns)."""

    model_config = _STRICT

    count: int = Field(8, ge=1, le=100_000, description="Problems (prompts).")
    seed: int = Field(0, description="Generator seed.")
    kind: Literal["word_problems", "one_step"] = Field("word_problems", description="Which task.")
    operations: str = Field("+", pattern=r"^[-+*]+$", description="one_step: operations drawn from (+, - and *).")
    max_operand: int = Field(20, ge=1, le=1_000_000, description="one_step: operands are drawn from 1..max_operand.")


class CodingTasksDataset(BaseModel):
    """Coding tasks in Harbor's layout (a repository, instruction.md, hidden tests; docs/coding-agents.md), played
    by a coding harness (``agent.harness``): a folder of them, or the bundled generated set (little Python
    repositories, each with one seeded bug)."""

    model_config = _STRICT

    path: str | None = Field(None, description="A task folder, or a folder of task folders.")
    generated: int | None = Field(None, ge=1, le=40, description="This many of the bundled generated tasks instead.")
    seed: int = Field(0, description="generated: which tasks, in which order.")

    @model_validator(mode="after")
    def _one_source(self) -> CodingTasksDataset:
        if (self.path is None) == (self.generated is None):
            raise ValueError("dataset.coding_tasks: give exactly one of path or generated")
        return self


class ReasoningGymDataset(BaseModel):
    """One of reasoning-gym's procedural tasks (the ``reasoning-gym`` extra; docs/environments.md), generated from a
    seed and scored by the task's own scorer: the reward is its ``score_answer`` of the reply's last
    ``<answer>...</answer>``. Rows run the single_turn loop; a question the task repeats is kept once."""

    model_config = _STRICT

    task: str = Field(description="A reasoning-gym dataset name, e.g. leg_counting or basic_arithmetic "
                      "(reasoning_gym.factory.DATASETS lists them).")
    size: int = Field(64, ge=1, le=100_000, description="Entries generated (0..size-1), each a prompt unless its "
                      "question repeats an earlier one.")
    seed: int = Field(0, description="The task's seed: the same seed, size and config give the same rows.")
    config: dict[str, Any] = Field(
        {}, description="The task's own config fields (those of its *Config class, e.g. "
        "{min_animals: 1, max_animals: 2} for leg_counting), passed to reasoning_gym.create_dataset; size and seed "
        "are the fields above.")
    system_prompt: str | None = Field(
        None, description="The system message of every row; None: an instruction to write the final answer between "
        "<answer> and </answer> (what the reward reads).")
    shots: int = Field(
        0, ge=0, le=16, description="Worked examples before each question: other entries of the task asked and "
        "answered between the tags (a small model that ignores the instruction copies the format from them).")

    @field_validator("task")
    @classmethod
    def _known_task(cls, task: str) -> str:
        from . import reasoning_gym_tasks

        return reasoning_gym_tasks.check_task(task)

    @field_validator("config")
    @classmethod
    def _config_builds(cls, config: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        from . import reasoning_gym_tasks

        if not {"task", "size", "seed"} <= info.data.keys():  # one of them was refused already, and said so
            return config
        ref = reasoning_gym_tasks.TaskRef(info.data["task"], info.data["size"], info.data["seed"], config)
        return reasoning_gym_tasks.check_config(ref)


class Dataset(BaseModel):
    """Prompts: a JSONL or Parquet file, the generated arithmetic task, or a reasoning-gym task.

    A row has ``messages`` (chat messages), and optionally ``id``, ``ground_truth``, ``tools`` (names),
    ``tools_kwargs``, ``loop`` (default: the config's default_loop), ``interaction``.
    """

    model_config = _STRICT

    path: str | None = Field(None, description="A .jsonl or .parquet file of rows.")
    arithmetic: ArithmeticDataset | None = Field(None, description="Generate the demo task instead of reading a file.")
    reasoning_gym: ReasoningGymDataset | None = Field(
        None, description="Generate one reasoning-gym task instead of reading a file; its scorer is the reward.")
    verifiers: VerifiersEnvironment | None = Field(
        None, description="A verifiers environment's tasks instead of a file (the `verifiers` extra; "
        "docs/environments.md): the environment plays its rows through the gateway (the agent section, optional, "
        "says how sessions run) and its rewards score them.")
    coding_tasks: CodingTasksDataset | None = Field(
        None, description="Coding tasks played by agent.harness (docs/coding-agents.md): each row's task folder.")
    limit: int | None = Field(None, ge=1, description="Use only the first rows.")
    default_loop: str = Field("tool", description="Loop of rows that name none (a built-in one or one under loops).")
    ground_truth_kwargs: tuple[str, ...] = Field(
        ("check_answer",), description="Tools that get {'ground_truth': row.ground_truth} at CreateInstance."
    )

    @model_validator(mode="after")
    def _one_source(self) -> Dataset:
        sources = (self.path, self.arithmetic, self.reasoning_gym, self.verifiers, self.coding_tasks)
        if sum(source is not None for source in sources) != 1:
            raise ValueError("dataset: give exactly one of path, arithmetic, reasoning_gym, verifiers or coding_tasks")
        return self

    @property
    def reward(self) -> ComponentSpec | None:
        """The reward the rows bring (reasoning_gym: the task's scorer); None: the run's own or the default."""
        if self.reasoning_gym is None:
            return None
        from .reasoning_gym_reward import PATH

        return ComponentSpec(path=PATH)


class AgentRunConfig(BaseModel):
    """What a rollout and a training run share: the engines and tools, the prompts, the loops, the routing and the
    trackers. The loops rows may name are checked here, so a config naming a loop no worker has is refused."""

    model_config = _STRICT

    engines: Engines = Field(description="Engine servers (launched ones: the model `agentloop train` trains is "
                             "theirs).")
    tools: Tools = Field(default_factory=Tools, description="Tool servers.")
    dataset: Dataset = Field(description="Prompts.")
    loop: AgentLoopConfig = Field(default_factory=AgentLoopConfig, description="Loop limits and sampling.")
    loops: CustomLoops = Field(
        default_factory=dict, description="Loops of your own by name, beside single_turn and tool (rows and "
        "dataset.default_loop name them): path module:Class, built once per worker as Class(context, **kwargs), "
        "kwargs being the loop's own config.")
    router: RouterConfig = Field(default_factory=RouterConfig, description="Routing over the engine servers.")
    workers: int = Field(1, ge=1, description="Agent-loop workers.")
    report_to: tuple[TrackerName, ...] | None = Field(
        None, description=REPORT_TO_HELP + " `agentloop train` passes it to TRL's report_to; the rollout metrics "
        "join TRL's logs.")
    trackers: TrackerSettings = Field(
        default_factory=TrackerSettings, description="Run name, project and per-tracker settings of report_to "
        "(docs/trackers.md; `agentloop train` logs every step, whatever log_every says).")

    @model_validator(mode="before")
    @classmethod
    def _environment_plays(cls, data: Any) -> Any:
        """A verifiers dataset is played by its environment: it becomes the agent (the agent section, if any,
        keeps how sessions run)."""
        if not isinstance(data, dict):
            return data
        dataset, agent = data.get("dataset"), data.get("agent")
        dataset = dataset.model_dump(exclude_unset=True) if isinstance(dataset, BaseModel) else dataset
        agent = agent.model_dump(exclude_unset=True) if isinstance(agent, BaseModel) else dict(agent or {})
        environment = dataset.get("verifiers") if isinstance(dataset, dict) else None
        if environment is None:
            if agent.get("verifiers") is not None:
                raise ValueError("agent.verifiers: the environment's rows come from dataset: {verifiers: ...}")
            return data
        if agent.get("callable") is not None or agent.get("command") is not None:
            raise ValueError("agent: a verifiers dataset is played by its environment; give no callable or command")
        return {**data, "agent": {**agent, "verifiers": environment}}

    @property
    def loop_names(self) -> list[str]:
        """Every loop a row may name: the built-in ones and those under loops."""
        return sorted({*BUILTIN_LOOPS, *self.loops})

    @field_validator("report_to")
    @classmethod
    def _trackers_installed(cls, value: tuple[TrackerName, ...] | None) -> tuple[TrackerName, ...] | None:
        return check_report_to(value)

    @model_validator(mode="after")
    def _default_loop_exists(self) -> AgentRunConfig:
        if self.dataset.default_loop not in self.loop_names:
            raise ValueError(f"dataset.default_loop: no loop named {self.dataset.default_loop!r}; known: "
                             f"{self.loop_names} (add yours under loops)")
        return self


class RolloutConfig(AgentRunConfig):
    """A whole rollout: which engines and tools, which prompts, how loops run, where outputs go."""

    samples_per_prompt: int = Field(1, ge=1, le=1024, description="Trajectories per prompt (a GRPO group).")
    reward: ComponentSpec | None = Field(None, description="Reward function (default: tool rewards + interaction).")
    interactions: dict[str, ComponentSpec] = Field(default_factory=dict, description="Interactions by name.")
    ray: bool = Field(False, description="Run the workers as Ray actors (local Ray, or the cluster Ray is on).")
    max_concurrency: int = Field(256, ge=1, description="Loops in flight per worker.")
    output_dir: str = Field("runs/rollout", description="Where trajectories, trace, batch and report go.")
    trace: bool = Field(True, description="Write the per-turn trace (trace.jsonl).")
    report: bool = Field(True, description="Write report.html with plots.")
    metrics_port: int | None = Field(
        None, ge=0, le=65535, description="Serve the Router's Prometheus metrics at http://127.0.0.1:PORT/metrics "
        "while the rollout runs (0: a free port, printed). With several or Ray workers, the control router's."
    )
    max_failed_share: float = Field(
        1.0, gt=0, le=1, description="`agentloop rollout` exits 3 when failed trajectories / all trajectories reaches "
        "this share (1.0: only when every trajectory failed; a run with none counts as all failed). The outputs are "
        "written either way."
    )
    prompt_length: int | None = Field(None, ge=1, description="Pad prompts to this length in batch.pt (default: "
                                      "longest).")
    response_length: int | None = Field(None, ge=1, description="Pad responses to this length (default: longest).")
    agent: ExternalAgent | None = Field(
        None, description="Run an agent of your own through the session gateway instead of our loops (None: the "
        "loops).")

    @property
    def reward_function(self) -> ComponentSpec | None:
        """What scores the trajectories: reward, else the one the dataset brings; None: the default (tool rewards
        and the interaction's score)."""
        return self.reward if self.reward is not None else self.dataset.reward

    @model_validator(mode="after")
    def _agent_reward(self) -> RolloutConfig:
        if self.agent is not None and self.agent.reward == "function" and self.reward_function is None:
            raise ValueError("agent.reward: function scores with the rollout's reward function; set reward")
        if self.dataset.coding_tasks is not None and (self.agent is None or self.agent.harness is None):
            raise ValueError("dataset.coding_tasks: a coding harness plays them; set agent.harness")
        return self


def load_config(path: str | Path) -> RolloutConfig:
    """Read and validate a rollout YAML (ValidationError / OSError / yaml.YAMLError / ValueError on bad input)."""
    return load_yaml_config(path, RolloutConfig, "a rollout config")
