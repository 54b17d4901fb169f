"""A verl trainer's rows with pictures through ``AgentloopAgentLoopManager``: the batch it returns carries each row's
pictures as the processor's tensors in ``multi_modal_inputs`` (what verl's actor feeds the model with). The engine
is the fake (it takes any span); the model path is the tiny VLM, whose processor expands and encodes the pictures
(its vision part is random: the pictures mean nothing to it)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("verl", reason="verl is not installed (make setup installs it)")

import torch
from omegaconf import OmegaConf
from verl import DataProto
from verl.utils.import_utils import load_class_from_fqn

from agentloop_grpc.common.media import ImageExpander, decode_image
from agentloop_grpc.engine_adapters.factory import make_adapter
from agentloop_grpc.engine_adapters.server import create_server, start_adapter
from agentloop_grpc.integrations.background_loop import BackgroundLoop

from .pictures import png

MANAGER = "agentloop_grpc.integrations.verl.manager.AgentloopAgentLoopManager"
PROMPT_LENGTH, RESPONSE_LENGTH = 256, 16


@pytest.fixture(scope="module")
def fake_engine():
    loop = BackgroundLoop("fake-engine")

    async def start():
        server = await create_server(make_adapter("fake", {"vocab_size": 49192}), "127.0.0.1:0")
        await start_adapter(server)
        return server

    server = loop.run(start())
    yield f"127.0.0.1:{server.port}"
    loop.run(server.stop(grace_s=1))
    loop.close()


def test_the_managers_batch_carries_each_rows_pictures_for_verls_actor(tiny_vlm, fake_engine) -> None:
    from PIL import Image

    red = Image.new("RGB", (40, 30), (255, 0, 0))
    config = OmegaConf.create({"actor_rollout_ref": {
        "model": {"path": str(tiny_vlm)},
        "rollout": {"prompt_length": PROMPT_LENGTH, "response_length": RESPONSE_LENGTH, "n": 1, "temperature": 1.0,
                    "top_p": 1.0, "top_k": -1,
                    "val_kwargs": {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "n": 1, "do_sample": False},
                    "multi_turn": {"max_assistant_turns": 1, "format": "hermes"},
                    "agent": {"num_workers": 1, "default_agent_loop": "single_turn_agent",
                              "agent_loop_manager_class": MANAGER},
                    "custom": {"agentloop": {"servers": [fake_engine],
                                             "loops": {"loop": {"max_new_tokens_per_turn": 8}}}}},
    }})
    picture = [{"role": "user", "content": [{"type": "image", "image": red}, {"type": "text", "text": "Colour?"}]}]
    text = [{"role": "user", "content": "Say hello."}]
    rows = DataProto.from_single_dict({
        "dummy_tensor": torch.zeros(2, 1), "raw_prompt": np.array([picture, text], dtype=object),
        "agent_name": np.array(["single_turn_agent"] * 2, dtype=object), "uid": np.array(["a", "b"], dtype=object),
    }, meta_info={"validate": True})
    manager = load_class_from_fqn(MANAGER).create(config=config, llm_client=None)  # type: ignore[attr-defined]  # verl types it `type`
    try:
        output = manager.generate_sequences(rows)
    finally:
        manager.close()
    with_picture, without = output.non_tensor_batch["multi_modal_inputs"]
    assert without == {}
    expected = ImageExpander.load(str(tiny_vlm)).expand(decode_image(png((255, 0, 0)), "image/png")).inputs
    assert set(with_picture) == set(expected)
    for key, value in expected.items():
        torch.testing.assert_close(with_picture[key], torch.as_tensor(value))
