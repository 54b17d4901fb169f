"""PromptEncoder encodes a prompt piece by piece between the added tokens, remembering the pieces: the ids must be
the tokenizer's for the whole text, the first time and from what it remembered."""

from __future__ import annotations

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
