"""Write docs/rollout-config.md, docs/train-config.md and docs/engine-config.md from the pydantic models, so the
references can never drift from the code (tests/test_docs.py checks the committed files equal what this prints)."""

from __future__ import annotations

import sys
from pathlib import Path

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from agentloop_grpc.agent.config import AgentLoopConfig, SamplingConfig
from agentloop_grpc.agent.spec import ComponentSpec
from agentloop_grpc.engine_adapters.embedded.config import EmbeddedEngineConfig
from agentloop_grpc.engine_adapters.fake_config import FakeEngineConfig
from agentloop_grpc.engine_adapters.sglang.config import ActorNaming, SglangEngineConfig
from agentloop_grpc.engine_adapters.vllm.config import VllmEngineConfig
from agentloop_grpc.gateway.config import ForcedSampling, GatewayConfig, GatewayLimits
from agentloop_grpc.integrations.verifiers.config import VerifiersEnvironment
from agentloop_grpc.rollout.config import (
    ArithmeticDataset,
    Dataset,
    Engines,
    ExternalAgent,
    LaunchEngines,
    ReasoningGymDataset,
    RolloutConfig,
    Tools,
)
from agentloop_grpc.router import RouterConfig
from agentloop_grpc.client_security import ClientSecurity
from agentloop_grpc.trackers.config import MlflowSettings, TensorBoardSettings, TrackerSettings, WandbSettings
from agentloop_grpc.train.config import CorrectionSettings, GrpoSettings, TrainConfig

#: report_to's settings: the same section in the rollout and the train config.
TRACKER_SECTIONS: list[tuple[type[BaseModel], str]] = [
    (TrackerSettings, "trackers."),
    (TensorBoardSettings, "trackers.tensorboard."),
    (WandbSettings, "trackers.wandb."),
    (MlflowSettings, "trackers.mlflow."),
]

SECTIONS: list[tuple[type[BaseModel], str]] = [
    (RolloutConfig, ""),
    (Engines, "engines."),
    (LaunchEngines, "engines.launch."),
    (Tools, "tools."),
    (Dataset, "dataset."),
    (ArithmeticDataset, "dataset.arithmetic."),
    (ReasoningGymDataset, "dataset.reasoning_gym."),
    (VerifiersEnvironment, "dataset.verifiers."),
    (AgentLoopConfig, "loop."),
    (SamplingConfig, "loop.sampling."),
    (RouterConfig, "router."),
    (ClientSecurity, "router.security. / tools.security."),
    (ComponentSpec, "reward. / interactions.NAME. / loops.NAME."),
    (ExternalAgent, "agent."),
    (GatewayConfig, "agent.gateway."),
    (ForcedSampling, "agent.gateway.sampling."),
    (GatewayLimits, "agent.gateway.limits."),
    *TRACKER_SECTIONS,
]


def _default(field) -> str:
    if field.default is PydanticUndefined:
        return "required" if field.default_factory is None else "see its section"
    value = list(field.default) if isinstance(field.default, tuple) else field.default
    return f"`{value}`"


TRAIN_SECTIONS: list[tuple[type[BaseModel], str]] = [
    (TrainConfig, ""),
    (GrpoSettings, "grpo."),
    (CorrectionSettings, "correction."),
    *TRACKER_SECTIONS,
]

ENGINE_SECTIONS: list[tuple[type[BaseModel], str]] = [
    (EmbeddedEngineConfig, "kind: embedded"),
    (VllmEngineConfig, "kind: vllm"),
    (SglangEngineConfig, "kind: sglang"),
    (ActorNaming, "kind: sglang, naming."),
    (FakeEngineConfig, "kind: fake"),
]

DOCUMENTS = {
    "rollout-config.md": ("`agentloop rollout`", "examples/demo.yaml", SECTIONS, ""),
    "train-config.md": ("`agentloop train`", "examples/train.yaml", TRAIN_SECTIONS,
                        "The `engines`, `tools`, `dataset`, `loop` and `router` sections are the rollout's: see "
                        "`rollout-config.md`."),
    "engine-config.md": ("`agentloop engine serve --config`", "examples/engine.yaml", ENGINE_SECTIONS,
                         "One adapter's fields, chosen by `kind` (or `--adapter`); `--set KEY=VALUE` sets one "
                         "(`naming.prefix=p` a nested one). A rollout's `engines.launch.engine` is the same mapping."),
}


def render(name: str = "rollout-config.md") -> str:
    command, example, sections, note = DOCUMENTS[name]
    lines = [
        f"# {command} configuration reference",
        "",
        "Generated from the pydantic models by `docs/generate_config_reference.py`; unknown fields are errors.",
        f"Example: `{example}`.{' ' + note if note else ''}",
        "",
    ]
    for model, prefix in sections:
        summary = " ".join((model.__doc__ or "").strip().split("\n\n")[0].split())  # its first paragraph, one line
        lines += [f"## `{prefix or '(top level)'}`", "", summary, "",
                  "| field | default | meaning |", "|---|---|---|"]
        for name, field in model.model_fields.items():
            if field.exclude:  # set from Python only (a function), never from a file
                continue
            lines.append(f"| `{name}` | {_default(field)} | {field.description or ''} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    stale = []
    for name in DOCUMENTS:
        target = Path(__file__).with_name(name)
        if sys.argv[1:] == ["--check"]:
            if not target.is_file() or target.read_text() != render(name):
                stale.append(name)
        else:
            target.write_text(render(name))
    sys.exit(1 if stale else 0)
