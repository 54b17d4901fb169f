"""Write docs/rollout-config.md from the pydantic models, so the reference can never drift from the code
(tests/test_docs.py checks the committed file equals what this prints)."""

from __future__ import annotations

import sys
from pathlib import Path

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from agentloop_grpc.agent.config import AgentLoopConfig, SamplingConfig
from agentloop_grpc.agent.spec import ComponentSpec
from agentloop_grpc.rollout.config import ArithmeticDataset, Dataset, Engines, LaunchEngines, RolloutConfig, Tools
from agentloop_grpc.router import RouterConfig

SECTIONS: list[tuple[type[BaseModel], str]] = [
    (RolloutConfig, ""),
    (Engines, "engines."),
    (LaunchEngines, "engines.launch."),
    (Tools, "tools."),
    (Dataset, "dataset."),
    (ArithmeticDataset, "dataset.arithmetic."),
    (AgentLoopConfig, "loop."),
    (SamplingConfig, "loop.sampling."),
    (RouterConfig, "router."),
    (ComponentSpec, "reward. / interactions.NAME."),
]


def _default(field) -> str:
    if field.default is PydanticUndefined:
        return "required" if field.default_factory is None else "see its section"
    value = list(field.default) if isinstance(field.default, tuple) else field.default
    return f"`{value}`"


def render() -> str:
    lines = [
        "# `agentloop rollout` configuration reference",
        "",
        "Generated from the pydantic models by `docs/generate_config_reference.py`; unknown fields are errors.",
        "Example: `examples/demo.yaml`.",
        "",
    ]
    for model, prefix in SECTIONS:
        lines += [f"## `{prefix or '(top level)'}`", "", (model.__doc__ or "").strip().split("\n\n")[0], "",
                  "| field | default | meaning |", "|---|---|---|"]
        for name, field in model.model_fields.items():
            lines.append(f"| `{name}` | {_default(field)} | {field.description or ''} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    target = Path(__file__).with_name("rollout-config.md")
    if sys.argv[1:] == ["--check"]:
        sys.exit(0 if target.read_text() == render() else 1)
    target.write_text(render())
