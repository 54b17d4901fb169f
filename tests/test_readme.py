"""Every snippet in the README is run. Python snippets and quick shell lines run here for real, against the
engine server the README's own command starts (only its port becomes 0); the long jobs (`make demo`, `make
train`, `make test`, `pip install`) are each mapped to the existing test that runs the same command, and that
mapping is checked. A snippet that nothing runs fails `test_every_snippet_is_run`."""

from __future__ import annotations

import ast
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
FENCE = re.compile(r"^```(?P<lang>[\w-]*)\n(?P<body>.*?)^```", re.M | re.S)


@dataclass(frozen=True)
class Block:
    lang: str
    body: str
    line: int


@dataclass(frozen=True)
class Covered:
    """A long command run by an existing test: ``path::function``, whose source must contain every needle."""

    path: str
    function: str
    needles: tuple[str, ...]


def fenced_blocks(path: Path) -> list[Block]:
    text = path.read_text()
    return [Block(m["lang"], m["body"], text.count("\n", 0, m.start()) + 1) for m in FENCE.finditer(text)]


def commands(block: Block) -> list[str]:
    """The shell lines of a block without their comments and a trailing `&`."""
    lines = (line.split("#", 1)[0].strip() for line in block.body.splitlines())
    return [line.removesuffix("&").strip() for line in lines if line]


# The README's server line, run for real by test_python_snippets_run_against_the_readme_server.
SERVE = "agentloop engine serve --adapter fake --port 50051"
README_PORT = "50051"

# Long jobs: the Makefile recipe or script the line runs, and the tests that run the same command.
MAKE_DEMO_RECIPE = "-m agentloop_grpc.cli rollout --config examples/demo.yaml"
MAKE_TRAIN_RECIPE = "-m agentloop_grpc.cli train --config examples/train.yaml"
COVERED: dict[str, tuple[Covered, ...]] = {
    # The demo's parts, each run by a test: `agentloop rollout --config` end to end (fake engines launched, the
    # built-in tools, every output), its YAML loaded, two embedded replicas launched, and the constrained tool
    # loop on the real model. The whole demo on the real model is minutes on 2 cores: `make demo` itself runs it.
    "make demo": (
        Covered("tests/rollout/test_rollout_cli.py", "test_rollout_writes_every_output_and_stops_its_servers",
                ('"rollout", "--config"',)),
        Covered("tests/test_docs.py", "test_demo_config_is_valid", ('"examples" / "demo.yaml"',)),
        Covered("tests/rollout/test_engine_launch.py", "test_launch_dp2_serves_two_replicas_a_router_uses",
                ('"launch", "--adapter", adapter, "--dp", "2"',)),
        Covered("tests/agent/test_embedded_rollout.py", "test_constrained_tool_trajectory_logprobs_match_a_recompute",
                ("constrain_tool_calls=True",)),
    ),
    # `agentloop train --config` on the real model for two steps, and the training YAML `make train` uses
    "make train": (
        Covered("tests/train/test_train_cli.py", "test_train_writes_metrics_report_weights_and_the_ratio",
                ('"train", "--config"',)),
        Covered("tests/test_docs.py", "test_train_config_is_valid", ('"examples" / "train.yaml"',)),
    ),
    "make test": (Covered(".ci/run", "", ("make test",)),),
    # the gateway command over a running engine server, answering the openai SDK at a session's base URL
    "agentloop gateway --engines 127.0.0.1:50051 --port 8100": (
        Covered("tests/gateway/test_gateway_command.py",
                "test_the_gateway_command_serves_sessions_and_stops_on_sigterm",
                ('start_gateway("--engines"', 'base_url=f"{url}/sessions/c1/v1"')),
    ),
    # the wheel built from this checkout, installed in a clean venv, then the quickstart's fake server and a client
    "pip install .": (
        Covered("tests/packaging/test_install.py", "install", ('"-m", "pip"', '"install"', "str(wheel)")),
        Covered("tests/packaging/test_install.py", "test_a_fake_engine_server_answers_a_generated_stub_client",
                ('"engine", "serve", "--adapter", "fake"',)),
    ),
    # `make setup` (every `make` job's first step) installs the dev extra, which holds these two
    # make setup pins the same torch; this machine's pip resolves the pin to the CPU build without the index URL
    "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu": (
        Covered("Makefile", "", ("pip install --quiet torch==2.13.0",)),
    ),
    "pip install '.[embedded,rollout]'": (
        Covered("Makefile", "", ("pip install --quiet -e '.[dev]'",)),
        Covered("pyproject.toml", "", ('"agentloop-grpc[embedded,rollout,',)),
    ),
}


def _readme_blocks() -> list[Block]:
    blocks = fenced_blocks(README)
    assert blocks, "the README has no code blocks"
    return blocks


def _python_blocks() -> list[Block]:
    return [b for b in _readme_blocks() if b.lang == "python"]


def test_every_snippet_is_run():
    for block in _readme_blocks():
        if block.lang == "python":
            continue  # every one runs in test_python_snippets_run_against_the_readme_server
        if block.lang == "json":
            continue  # dataset rows: test_dataset_rows_are_the_ones_a_rollout_test_runs
        assert block.lang == "bash", f"README line {block.line}: no test runs a `{block.lang}` block"
        for command in commands(block):
            assert command == SERVE or command in COVERED, (
                f"README line {block.line}: nothing runs `{command}`; run it in tests/test_readme.py or map it to "
                "the test that runs it in COVERED")


def _function_source(path: Path, name: str) -> str:
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return ast.get_source_segment(path.read_text(), node) or ""
    raise AssertionError(f"{path.relative_to(ROOT)} has no test function {name}")


def test_dataset_rows_are_the_ones_a_rollout_test_runs():
    """A `json` block is a dataset row: the one of docs/multimodal.md, which
    tests/multimodal/test_rollout_images.py writes to a dataset file and runs `agentloop rollout` on."""
    rows = [block.body for block in _readme_blocks() if block.lang == "json"]
    documented = [block.body for block in fenced_blocks(ROOT / "docs" / "multimodal.md") if block.lang == "json"]
    assert rows and documented[:1] == rows
    assert '_block("json")' in (ROOT / "tests" / "multimodal" / "test_rollout_images.py").read_text()


@pytest.mark.parametrize("command", sorted(COVERED))
def test_long_commands_are_run_by_an_existing_test(command):
    for covered in COVERED[command]:
        path = ROOT / covered.path
        assert path.is_file(), f"`{command}`: {covered.path} does not exist, so nothing runs it"
        source = _function_source(path, covered.function) if covered.function else path.read_text()
        for needle in covered.needles:
            assert needle in source, f"`{command}`: {covered.path}::{covered.function} does not run {needle}"


def _recipe(target: str) -> str:
    match = re.search(rf"^{target}:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M)
    assert match, f"the Makefile has no `{target}` target"
    return match[1]


@pytest.mark.parametrize(("target", "runs"), [("demo", MAKE_DEMO_RECIPE), ("train", MAKE_TRAIN_RECIPE)])
def test_make_targets_run_what_the_readme_says(target, runs):
    assert runs in _recipe(target)
    readme = README.read_text()
    assert f"It runs `agentloop {runs.split('cli ', 1)[1]}`" in readme, f"the README misnames what make {target} runs"


@pytest.fixture(scope="module")
def readme_server():
    """The README's serve command as it is written, on port 0 instead of its own."""
    argv = shlex.split(SERVE.replace(f"--port {README_PORT}", "--port 0"))
    assert argv[0] == "agentloop"
    process = subprocess.Popen([sys.executable, "-m", "agentloop_grpc.cli", *argv[1:]], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert "listening on 127.0.0.1:" in line, line + process.stderr.read()
        yield line.split("listening on 127.0.0.1:", 1)[1].split()[0]
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_the_readme_serve_command_is_the_one_run():
    assert [c for b in _readme_blocks() if b.lang == "bash" for c in commands(b) if c == SERVE] == [SERVE]


@pytest.mark.parametrize("index", range(len(_python_blocks())))
def test_python_snippets_run_against_the_readme_server(readme_server, index):
    block = _python_blocks()[index]
    assert README_PORT in block.body, f"README line {block.line}: the snippet does not call the server"
    result = subprocess.run([sys.executable, "-c", block.body.replace(README_PORT, readme_server)],
                            capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, f"README line {block.line}:\n{result.stderr}"
    if "TokenGenerateStub" in block.body:  # the quickstart: what it prints is what the README says it prints
        assert "chunk {" in result.stdout and "FINISH_REASON_LENGTH" in result.stdout, result.stdout
        assert "completion_tokens: 8" in result.stdout, result.stdout


def test_the_first_request_is_on_the_first_screen():
    lines = README.read_text().splitlines()
    assert lines.index("## Quickstart 1: an engine server and a gRPC call") < 30


FIGURE = re.compile(r"\b\d+(?:[.,]\d+)?\s?(?:ms|us|s|min|x|%|tok/s|calls/s|tokens/s)(?![\w/])")
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")


def test_figures_are_dated_and_linked_to_the_results():
    prose = FENCE.sub("", README.read_text())
    for paragraph in prose.split("\n\n"):
        for figure in FIGURE.findall(paragraph.replace("`", "")):
            assert DATE.search(paragraph) and "bench/RESULTS.md" in paragraph, (
                f"the README quotes {figure!r} without a date and a link to bench/RESULTS.md:\n{paragraph}")


LINK = re.compile(r"\]\(([^)\s]+)\)")
# a path in backquotes that climbs out of the file's folder, e.g. `../shared/NOTES.md`
QUOTED_PATH = re.compile(r"`(\.\./[^`\s]+)`")


def anchors(path: Path) -> set[str]:
    """The heading anchors GitHub makes: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#+ (.+)$", FENCE.sub("", path.read_text()), re.M)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


def broken_links(path: Path) -> list[str]:
    """Relative links of a Markdown file that leave the repository, name a missing file or a missing heading."""
    broken = []
    text = path.read_text()
    for target in LINK.findall(text) + QUOTED_PATH.findall(text):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        resolved = (path.parent / file).resolve() if file else path
        if not resolved.is_relative_to(ROOT) or not resolved.exists():
            broken.append(target)
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(target)
    return broken


def test_links_stay_in_the_repository_and_exist():
    assert broken_links(README) == []


def test_the_readme_stays_an_on_ramp():
    """Reference material belongs in docs/: the README had grown to 26 KB in 16 sections before it moved there."""
    text = README.read_text()
    sections = [line for line in text.splitlines() if line.startswith("## ")]
    assert len(text) < 7000 and len(sections) <= 8, (len(text), sections)
