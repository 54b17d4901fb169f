"""The shared contract suite (tests/contract) run against the SGLang adapter, its engine a stand-in in Ray actors.

The contract's test functions are imported as they are and bound here to this module's ``engine`` fixture: one
server per module over the session's stand-in actor (``conftest.moe_group``, shared with the routed-experts tests;
``tests/contract/conftest.py`` builds the fake, embedded and vLLM targets and is not edited from here). Every
contract test runs; none is skipped.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from agentloop_grpc.v1 import engine_pb2

from ..contract.target import ContractTarget
from ..contract.test_bad_input import *  # noqa: F403 (the contract tests, collected here against SGLang)
from ..contract.test_control import *  # noqa: F403
from ..contract.test_generate import *  # noqa: F403
from ..contract.test_load_weights import *  # noqa: F403
from ..contract.test_sessions import *  # noqa: F403
from ..contract.test_weight_groups import *  # noqa: F403
from .conftest import sglang_server


@pytest.fixture(scope="module")
async def sglang_target(moe_group) -> AsyncIterator[ContractTarget]:
    async with sglang_server(moe_group) as server:
        address = f"127.0.0.1:{server.port}"
        async with grpc.aio.insecure_channel(address) as channel:
            yield ContractTarget(
                name="sglang",
                address=address,
                channel=channel,
                prompt=[11, 12, 13, 14, 15, 16, 17, 18],
                long_tokens=1000,
                sample_tensor=engine_pb2.TensorChunk(
                    name="model.norm.weight", dtype=engine_pb2.TENSOR_DTYPE_FLOAT32, shape=[2, 2], data=bytes(16)
                ),
            )


@pytest.fixture
async def engine(sglang_target: ContractTarget) -> AsyncIterator[ContractTarget]:
    """What the contract tests ask for: the SGLang server, clean before and after each test."""
    await sglang_target.reset()
    yield sglang_target
    await sglang_target.reset()
