"""The locally built vision-language checkpoint (tiny_vlm.py) is what the multi-modal tests need: transformers loads
it with its processor, its text behaviour is SmolLM2's exactly, and an image's pixels reach the language model."""

from __future__ import annotations

import io

import pytest

from agentloop_grpc.common import model_store

from .pictures import png
from .tiny_vlm import IMAGE_SEQ_LEN

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def vlm(tiny_vlm_reference):
    return tiny_vlm_reference


def _image(data: bytes):
    from PIL import Image

    return Image.open(io.BytesIO(data)).convert("RGB")


def test_text_only_logits_are_smollm2s(vlm):
    import torch
    from transformers import AutoModelForCausalLM

    model, processor = vlm
    text = AutoModelForCausalLM.from_pretrained(model_store.prepare(), dtype=torch.float32).eval()
    ids = processor.tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        ours = model(input_ids=ids).logits[0, :, : text.config.vocab_size]
        theirs = text(input_ids=ids).logits[0]
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)


def test_one_image_expands_to_a_fixed_span_and_its_pixels_reach_the_model(vlm):
    import torch

    model, processor = vlm
    tokenizer = processor.tokenizer
    image_id = tokenizer.convert_tokens_to_ids("<image>")
    outputs = []
    for colour in ((255, 0, 0), (0, 0, 255)):
        inputs = processor(text="User:<image>What is this?", images=[_image(png(colour))], return_tensors="pt")
        ids = inputs.input_ids[0].tolist()
        assert ids.count(image_id) == IMAGE_SEQ_LEN
        start = ids.index(image_id) - 2  # <fake_token_around_image><global-img> open the span
        assert tokenizer.convert_ids_to_tokens(ids[start:start + 2]) == ["<fake_token_around_image>", "<global-img>"]
        assert tokenizer.convert_ids_to_tokens(ids[start + 2 + IMAGE_SEQ_LEN]) == "<fake_token_around_image>"
        with torch.no_grad():
            outputs.append(model(**inputs).logits[0, -1])
    assert not torch.allclose(outputs[0], outputs[1])  # another picture, other logits: the pixels were used
