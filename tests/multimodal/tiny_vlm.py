"""A small vision-language checkpoint built at test time: Idefics3 with SmolLM2-135M-Instruct as its text backbone and
a small, randomly initialised vision encoder and connector.

Nothing is downloaded: the text weights are the bundled SmolLM2's. The pictures mean nothing to this model (its
vision part is random), but every step a real one takes runs: image bytes -> the processor -> placeholder tokens ->
pixel values -> vision encoder -> connector -> the language model. Idefics3 because both transformers and vLLM's
CPU build support it and its processor needs no torchvision; image splitting is off, so one image is a fixed
span of ids (the ``<fake_token_around_image><global-img>`` opener, ``IMAGE_SEQ_LEN`` ``<image>`` ids, a closer).
The head is saved untied (a copy of SmolLM2's tied embedding): transformers and vLLM decide tying from different
config fields, and an explicit head reads the same in both.
"""

from __future__ import annotations

from pathlib import Path

#: The special tokens Idefics3's processor looks up: the image wrapper, the image itself, the end of an utterance,
#: the global image and the 6 x 6 tile grid (unused with splitting off, but the processor requires them).
SPECIAL_TOKENS = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"] + [
    f"<row_{row}_col_{col}>" for row in range(1, 7) for col in range(1, 7)
]
IMAGE_SIZE = 64
PATCH_SIZE = 8
SCALE_FACTOR = 2
#: (64 / 8)^2 patches, merged 2 x 2 by the connector's pixel shuffle.
IMAGE_SEQ_LEN = (IMAGE_SIZE // PATCH_SIZE) ** 2 // SCALE_FACTOR**2


#: Renders a message's content: a string as it is, a list of parts as its texts with ``<image>`` for each image.
_CONTENT_MACRO = """{%- macro content_text(content) -%}
{%- if content is string -%}{{- content -}}
{%- else -%}{%- for part in content -%}
{%- if part.type == 'image' -%}{{- '<image>' -}}{%- else -%}{{- part.text -}}{%- endif -%}
{%- endfor -%}{%- endif -%}
{%- endmacro -%}
"""


def chat_template(text_template: str) -> str:
    """The text model's template rendering content parts too (string content renders exactly as before)."""
    return _CONTENT_MACRO + text_template.replace("messages[0].content", "content_text(messages[0].content)").replace(
        "message.content", "content_text(message.content)")


def build_tiny_vlm(text_checkpoint: Path, out: Path, seed: int = 0) -> Path:
    """Write the checkpoint (weights, config, processor with tokenizer and chat template) to ``out``."""
    import torch
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3Processor,
    )
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    tokenizer = AutoTokenizer.from_pretrained(text_checkpoint)
    text_vocab = len(tokenizer)
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS})
    text = AutoModelForCausalLM.from_pretrained(text_checkpoint, dtype=torch.float32)
    text_config = {**text.config.to_dict(), "vocab_size": len(tokenizer), "tie_word_embeddings": False}
    config = Idefics3Config(
        text_config=text_config,
        vision_config={"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                       "num_attention_heads": 2, "image_size": IMAGE_SIZE, "patch_size": PATCH_SIZE},
        scale_factor=SCALE_FACTOR,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = Idefics3ForConditionalGeneration(config).eval()
    with torch.no_grad():
        backbone = text.model.state_dict()
        embedding = backbone.pop("embed_tokens.weight")
        missing, unexpected = model.model.text_model.load_state_dict(backbone, strict=False)
        assert missing == ["embed_tokens.weight"] and not unexpected, (missing, unexpected)
        new = model.model.text_model.embed_tokens.weight
        new[:text_vocab] = embedding
        new[text_vocab:] = embedding.mean(0)  # the added tokens start as an average token
        model.lm_head.weight.copy_(new)
    model.save_pretrained(out)
    image_processor = Idefics3ImageProcessorPil(
        do_image_splitting=False, size={"longest_edge": IMAGE_SIZE}, max_image_size={"longest_edge": IMAGE_SIZE}
    )
    tokenizer.chat_template = chat_template(tokenizer.chat_template)
    Idefics3Processor(image_processor=image_processor, tokenizer=tokenizer, image_seq_len=IMAGE_SEQ_LEN,
                      chat_template=tokenizer.chat_template).save_pretrained(out)
    return out
