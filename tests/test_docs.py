"""The docs stay true: the configuration references are generated from the code, the example configs load, and
the snippets of the docs pages compile, import what exists, parse, and name real CLI commands and options."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .test_readme import README, ROOT, broken_links, fenced_blocks


def test_config_references_are_current():
    result = subprocess.run([sys.executable, "docs/generate_config_reference.py", "--check"], cwd=ROOT)
    assert result.returncode == 0, "docs/*-config.md are stale: run python docs/generate_config_reference.py"


def test_demo_config_is_valid():
    from agentloop_grpc.rollout.config import load_config

    config = load_config(ROOT / "examples" / "demo.yaml")
    assert config.engines.launch.replicas == 2 and config.loop.constrain_tool_calls
    # the task the untrained model solves sometimes (docs/benchmarks.md), in groups large enough to differ
    assert config.dataset.arithmetic.kind == "one_step" and config.samples_per_prompt >= 4
    assert config.loop.sampling.temperature > 0


def test_the_word_problems_demo_config_is_valid():
    from agentloop_grpc.rollout.config import load_config

    config = load_config(ROOT / "examples" / "demo-word-problems.yaml")
    assert config.dataset.arithmetic.kind == "word_problems" and config.loop.constrain_tool_calls
    assert config.output_dir != load_config(ROOT / "examples" / "demo.yaml").output_dir


def test_train_config_is_valid():
    from agentloop_grpc.train.config import load_train_config

    config = load_train_config(ROOT / "examples" / "train.yaml")
    assert config.engines.launch.replicas == 2 and config.dataset.arithmetic.kind == "one_step"
    assert config.loop.constrain_tool_calls and config.loop.sampling.temperature > 0


def test_the_coding_agent_config_is_valid():
    from agentloop_grpc.rollout.config import load_config

    config = load_config(ROOT / "examples" / "coding-agent.yaml")
    assert config.agent is not None and config.agent.harness == "codex" and config.tools.launch is None
    assert config.dataset.coding_tasks is not None and config.dataset.coding_tasks.generated
    # Codex's ~6.5k-token prompt and its turns fit the context (beyond SmolLM2's trained 8,192: a warning says so)
    assert config.engines.launch.engine.max_model_len > 8192


def test_the_reasoning_gym_configs_are_valid_and_the_page_shows_their_task():
    from agentloop_grpc.rollout.config import load_config
    from agentloop_grpc.rollout.dataset import read_rows
    from agentloop_grpc.train.config import load_train_config

    train = load_train_config(ROOT / "examples" / "reasoning_gym.yaml")
    rollout = load_config(ROOT / "examples" / "reasoning_gym_rollout.yaml")
    assert train.dataset.reward is not None and train.tools.launch is None and train.loop.sampling.temperature > 0
    # the rollout measures the untrained rate on the training run's first prompts, sampled as it samples them
    assert rollout.dataset.reasoning_gym == train.dataset.reasoning_gym and rollout.dataset.limit
    assert read_rows(rollout.dataset) == read_rows(train.dataset)[: rollout.dataset.limit]
    assert rollout.loop.sampling.temperature == train.loop.sampling.temperature
    assert rollout.loop.max_new_tokens_per_turn == train.loop.max_new_tokens_per_turn
    assert rollout.samples_per_prompt == train.grpo.num_generations
    shown = [yaml.safe_load(b.body) for b in fenced_blocks(_page("environments")) if b.lang == "yaml"]
    example = yaml.safe_load((ROOT / "examples" / "reasoning_gym.yaml").read_text())
    assert {"dataset": example["dataset"]} in shown


# The pages the README links to that hold snippets (generated references and other helpers' pages excepted).
PAGES = ("agent-loops", "architecture", "benchmarks", "contract", "environments", "gateway", "internals", "metrics",
         "multimodal", "rollout", "router", "security", "serve-engines", "testing", "tools", "trl", "verl")


def _page(name: str) -> Path:
    return ROOT / "docs" / f"{name}.md"


@pytest.mark.parametrize("name", PAGES)
def test_page_links_stay_in_the_repository_and_exist(name):
    assert broken_links(_page(name)) == []


def _imports(tree: ast.AST) -> list[tuple[str, str | None]]:
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.module is not None, "a docs program is a script: it has no `from . import`"
            found += [(node.module, alias.name) for alias in node.names]
    return found


@pytest.mark.parametrize("name", PAGES)
def test_page_python_compiles_and_its_imports_resolve(name):
    for block in fenced_blocks(_page(name)):
        if block.lang != "python":
            continue
        where = f"docs/{name}.md line {block.line}"
        # snippets may await at top level, as they would inside the caller's coroutine
        tree = compile(block.body, where, "exec", flags=ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        for module, attribute in _imports(tree):
            if module.split(".")[0] != "agentloop_grpc":  # found, not imported: importing trl pulls in vLLM
                assert importlib.util.find_spec(module) is not None, f"{where}: no module {module}"
                continue
            imported = importlib.import_module(module)
            # `from package import submodule` imports the submodule: an attribute only once something imported it
            found = attribute is None or hasattr(imported, attribute)
            found = found or importlib.util.find_spec(f"{module}.{attribute}") is not None
            assert found, f"{where}: {module} has no {attribute}"


@pytest.mark.parametrize("name", PAGES)
def test_page_yaml_parses(name):
    for block in fenced_blocks(_page(name)):
        if block.lang == "yaml":
            assert isinstance(yaml.safe_load(block.body), dict), f"docs/{name}.md line {block.line}"


def _agentloop_lines(body: str) -> list[list[str]]:
    joined = body.replace("\\\n", " ")
    lines = []
    for line in joined.splitlines():
        for command in line.split("#", 1)[0].split(";"):
            argv = shlex.split(command)
            if argv and argv[0].endswith("agentloop") and argv[0] in ("agentloop", ".venv/bin/agentloop"):
                lines.append(argv[1:])
    return lines


@pytest.mark.parametrize("name", (*PAGES, "README"))
def test_agentloop_command_lines_name_real_commands_and_options(name):
    import typer
    from typer.core import TyperGroup

    from agentloop_grpc.cli.commands import app

    path = README if name == "README" else _page(name)
    for block in fenced_blocks(path):
        if block.lang != "bash":
            continue
        for argv in _agentloop_lines(block.body):
            command = typer.main.get_command(app)
            words = list(argv)
            while isinstance(command, TyperGroup) and words and not words[0].startswith("-"):
                word = words.pop(0)
                assert word in command.commands, f"{path.name} line {block.line}: no command `{word}`"
                command = command.commands[word]
            assert not isinstance(command, TyperGroup), f"{path.name} line {block.line}: {argv} names no command"
            options = {opt for param in command.params for opt in param.opts}
            for word in words:
                if word.startswith("--"):
                    assert word.split("=", 1)[0] in options, f"{path.name} line {block.line}: no option {word}"


# Pages whose Python blocks are whole programs, run against stand-ins for the servers they name: fake engines with
# the default model's vocabulary (the loops tokenize with it) and the built-in tool server; each documented port
# becomes a stand-in's port, and the program must print what says it got answers.
RUNNABLE = {
    "contract": (("50051",), "FINISH_REASON_LENGTH"),
    "router": (("50051", "50052"), "FinishReason.LENGTH"),
    "agent-loops": (("50051", "50052", "50061"), "'input_ids': (4, "),
}
SERVER_COMMANDS = (
    ("engine", "serve", "--adapter", "fake", "--set", "vocab_size=49152", "--port", "0"),
    ("engine", "serve", "--adapter", "fake", "--set", "vocab_size=49152", "--port", "0"),
    ("tools", "serve", "--config", "builtin", "--port", "0"),
)


@pytest.fixture(scope="module")
def stand_in_servers():
    """Two fake engine servers and a tool server, as processes on port 0; their bound ports."""
    processes = [subprocess.Popen([sys.executable, "-m", "agentloop_grpc.cli", *command], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for command in SERVER_COMMANDS]
    try:
        ports = []
        for process in processes:
            line = process.stdout.readline()
            assert "listening on 127.0.0.1:" in line, line + process.stderr.read()
            ports.append(line.split("listening on 127.0.0.1:", 1)[1].split()[0])
        yield ports
    finally:
        for process in processes:
            process.terminate()
            process.wait(timeout=30)


@pytest.mark.parametrize("name", sorted(RUNNABLE))
def test_page_python_programs_run(stand_in_servers, name):
    documented_ports, answered = RUNNABLE[name]
    blocks = [b for b in fenced_blocks(_page(name)) if b.lang == "python"]
    assert blocks, f"docs/{name}.md has no Python block to run"
    for block in blocks:
        body = block.body
        for documented, port in zip(documented_ports, stand_in_servers):
            assert documented in body, f"docs/{name}.md line {block.line} does not call {documented}"
            body = body.replace(documented, port)
        result = subprocess.run([sys.executable, "-c", body], capture_output=True, text=True, timeout=180, cwd=ROOT,
                                env={**os.environ, "HF_HUB_OFFLINE": "1"})
        assert result.returncode == 0, f"docs/{name}.md line {block.line}:\n{result.stderr}"
        assert answered in result.stdout, result.stdout
