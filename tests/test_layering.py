"""The layering holds: client and agent code never import server code, tools never import engine code, no
engine adapter imports another, and only commands import the CLI package. Read from the source (every ``import`` and ``from ... import``, lazy ones too)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "agentloop_grpc"
ADAPTERS = ("embedded", "vllm", "sglang", "fake")
#: Server code: what an engine or tool server runs to serve.
SERVER = ("agentloop_grpc.engine_adapters", "agentloop_grpc.serving", "agentloop_grpc.tools.server",
          "agentloop_grpc.tools.servicer")
#: Client and agent code: what a trainer or an agent loop imports.
CLIENT = ("agentloop_grpc.router", "agentloop_grpc.agent", "agentloop_grpc.integrations", "agentloop_grpc.common",
          "agentloop_grpc.client_security", "agentloop_grpc.channels", "agentloop_grpc.tools.client")
#: The command line: the ``agentloop`` group and its error printing.
CLI = ("agentloop_grpc.cli",)
#: What may import it: the CLI itself and the commands it adds (rollout's and train's).
COMMANDS = (*CLI, "agentloop_grpc.rollout.command", "agentloop_grpc.train.command")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Absolute names of every module ``path`` imports."""
    package = module_name(path).rsplit(".", 1)[0] if path.name != "__init__.py" else module_name(path)
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


MODULES = {module_name(p): imports(p) for p in PACKAGE.rglob("*.py") if "v1" not in p.relative_to(PACKAGE).parts[:1]}


def edges(source: tuple[str, ...], target: tuple[str, ...]) -> list[str]:
    return sorted(f"{m} -> {i}" for m, names in MODULES.items() if within(m, source)
                  for i in names if within(i, target))


def test_the_modules_are_found() -> None:
    assert "agentloop_grpc.router.router" in MODULES and "agentloop_grpc.engine_adapters.servicer" in MODULES
    assert "agentloop_grpc.cli.commands" in MODULES


def test_client_and_agent_code_never_import_server_code() -> None:
    assert edges(CLIENT, SERVER) == []


def test_tools_never_import_engine_code() -> None:
    assert edges(("agentloop_grpc.tools",), ("agentloop_grpc.engine_adapters",)) == []


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_no_adapter_imports_another(adapter: str) -> None:
    others = tuple(f"agentloop_grpc.engine_adapters.{a}" for a in ADAPTERS if a != adapter)
    assert edges((f"agentloop_grpc.engine_adapters.{adapter}",), others) == []


def test_only_commands_import_the_cli() -> None:
    # a library module importing the CLI would drag typer and every command into a trainer's process
    assert sorted(f"{m} -> {i}" for m, names in MODULES.items() if not within(m, COMMANDS)
                  for i in names if within(i, CLI)) == []


def test_the_gateway_never_imports_an_engine_adapter_or_a_job() -> None:
    # a codec and a session table over the Router (ARCHITECTURE.md): it reaches engines only through the Router
    assert edges(("agentloop_grpc.gateway",), ("agentloop_grpc.engine_adapters", "agentloop_grpc.rollout",
                                               "agentloop_grpc.train", "agentloop_grpc.tools.server")) == []


def test_the_coding_harness_imports_no_engine_and_no_job() -> None:
    # harnesses run beside any trainer: a job or an engine imported here would come with every rollout of them
    assert edges(("agentloop_grpc.harness",), ("agentloop_grpc.engine_adapters", "agentloop_grpc.rollout",
                                               "agentloop_grpc.train", "agentloop_grpc.cli")) == []
