"""The layering holds: client and agent code never import server code, tools never import engine code, no
engine adapter imports another, only commands import the CLI package, integrations never import a job, and no
package or module imports itself around a cycle. Read from the source (every ``import`` and ``from ... import``,
lazy and type-only ones too)."""

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
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            # ``base.name`` is the module itself when ``name`` is one (``from . import memory``), else a name in base
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


MODULES = {module_name(p): imports(p) for p in PACKAGE.rglob("*.py") if "v1" not in p.relative_to(PACKAGE).parts[:1]}


#: The jobs: what runs a rollout or a training run, and the command line over them.
JOBS = ("agentloop_grpc.rollout", "agentloop_grpc.train", "agentloop_grpc.cli")


def module_of(name: str) -> str | None:
    """The module of ours an imported name is, or is defined in (None: not ours)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts of ``graph`` with more than one node (Tarjan's), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            part = []
            while (top := stack.pop()) != node:
                part.append(top)
            if part:
                found.append(sorted([node, *part]))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def import_graph(level: int | None = None) -> dict[str, set[str]]:
    """Who imports whom among our modules, or among our packages (``level``: the dotted parts that name one)."""
    def node(module: str) -> str:
        return module if level is None else ".".join(module.split(".")[:level])

    graph: dict[str, set[str]] = {}
    for module, names in MODULES.items():
        targets = {node(m) for name in names if (m := module_of(name)) is not None}
        graph.setdefault(node(module), set()).update(targets - {node(module)})
    return graph


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


def test_integrations_never_import_a_job() -> None:
    # a trainer's integration is a library: a job imported here would come with its config, its CLI and its servers
    assert edges(("agentloop_grpc.integrations",), JOBS) == []


def test_no_package_imports_itself_through_another() -> None:
    assert cycles(import_graph(level=2)) == []


def test_no_module_imports_itself_through_another() -> None:
    # type-only imports count: a cycle there is the same knot, only hidden from the interpreter
    assert cycles(import_graph()) == []
