"""PromptEncoder encodes a prompt piece by piece between the added tokens, remembering the pieces: the ids must be
the tokenizer's for the whole text, the first time and from what it remembered."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from agentloop_grpc.agent.chat import ChatCodec
from agentloop_grpc.gateway.prompt_encoder import PromptEncoder

TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "Evaluate arithmetic.",
                                           "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}}]


def test_pieces_encode_as_the_whole_text(codec):
    encoder = PromptEncoder(codec, max_pieces=4)
    texts = [
        codec.render([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "17 * 23?"}], TOOLS,
                     add_generation_prompt=True),
        "<|im_start|><|im_start|>x<|im_end|>",  # added tokens side by side
        "  héllo 世界 <|endoftext|>\n\n<reponame>a <|im_start",  # an added token's prefix is text
        "",
        " <|im_end|> ",
    ]
    assert encoder._split is not None  # SmolLM2's added tokens split plainly: the pieces are used
    for _ in range(2):  # then from the pieces remembered (some dropped: at most 4 kept)
        for text in texts:
            assert encoder.encode(text) == codec.encode(text), text
    assert len(encoder._pieces) <= 4
    messages = [{"role": "user", "content": "Hi"}]
    assert encoder.prompt(messages, TOOLS, []).ids == codec.prompt(messages, TOOLS).ids


def _metaspace_codec() -> ChatCodec:
    """A SentencePiece-style tokenizer (Llama 2, Mistral 7B v0.1): a prefix space before the first piece of a text."""
    chars = "▁abcdefghijklmnopqrstuvwxyz\n"
    model = Tokenizer(models.BPE({"<unk>": 0, **{c: i + 1 for i, c in enumerate(chars)}}, [], unk_token="<unk>"))
    model.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    model.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=model, unk_token="<unk>")
    tokenizer.add_special_tokens({"additional_special_tokens": ["<s>", "</s>"]})
    return ChatCodec(tokenizer, "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}")


def test_a_tokenizer_that_marks_the_start_of_a_text_is_encoded_whole():
    # encoded alone, every piece after an added token would gain the prefix space the whole text gives it only once
    codec = _metaspace_codec()
    encoder = PromptEncoder(codec)
    text = codec.render([{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "ok"}])
    assert encoder.encode(text) == codec.encode(text)
    assert encoder._split is None
