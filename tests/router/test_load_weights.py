"""Fleet.load_weights: every server loads one checkpoint by path; the fleet takes the version they answer."""

from __future__ import annotations

import numpy as np
import pytest
from safetensors.numpy import save_file

from agentloop_grpc.router import GenerateCall, InfrastructureError, Router

from .conftest import address, fake_servers
from .test_routing import FAST, params


async def test_every_server_loads_the_checkpoint_and_the_fleet_takes_its_version(tmp_path) -> None:
    save_file({"w": np.zeros(4, dtype=np.float32)}, str(tmp_path / "model.safetensors"))
    async with fake_servers(2) as servers, Router([address(s) for s in servers], FAST) as router:
        await router.fleet.wait_ready(2)
        result = await router.fleet.load_weights(str(tmp_path), weight_version=7)
        result.raise_for_errors()
        assert {r.weight_version for r in result.responses.values()} == {7}
        assert {r.tensors_updated for r in result.responses.values()} == {1}
        assert {r.bytes_applied for r in result.responses.values()} == {16}
        assert router.fleet.weight_version == 7 and not router.fleet.held_out
        assert {s.lifecycle.weight_version for s in servers} == {7}
        generated = await router.generate(GenerateCall("s", [1, 2, 3], params(2)))
        assert set(generated.weight_versions) == {7}


async def test_a_path_no_server_can_read_fails_everywhere_and_changes_nothing(tmp_path) -> None:
    async with fake_servers(2) as servers, Router([address(s) for s in servers], FAST) as router:
        await router.fleet.wait_ready(2)
        result = await router.fleet.load_weights(str(tmp_path / "missing"))
        with pytest.raises(InfrastructureError, match=r"(?s)2 of 2 failed.*INVALID_ARGUMENT.*missing"):
            result.raise_for_errors()
        assert {s.lifecycle.weight_version for s in servers} == {0} and router.fleet.weight_version == 0
