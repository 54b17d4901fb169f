"""PromptEncoder: a new chain's rendered prompt as token ids, the pieces between special tokens remembered.

The sessions of a run open with the same system prompt and tools, which render to the same long text, and encoding
it was most of what a first turn cost the gateway. A tokenizer splits its text at its added tokens before it encodes
the pieces between them, so the pieces can be encoded one by one and those seen before read back: the ids are the
ids of the whole text encoded at once. A tokenizer whose added tokens strip the whitespace beside them, match whole
words only or are matched after normalization does not split this simply, nor one that marks the start of a text
(SentencePiece's prefix space, which it puts only before the first piece of a whole text): a probe at construction
finds the latter, and such a tokenizer's prompts are encoded whole.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from typing import Any

from agentloop_grpc.agent.chat import ChatCodec, Encoded
from agentloop_grpc.agent.images import Picture

#: Pieces remembered, least recently used dropped first: a run's system prompts and tool lists, many times over.
MAX_PIECES = 256


class PromptEncoder:
    def __init__(self, codec: ChatCodec, max_pieces: int = MAX_PIECES) -> None:
        self.codec = codec
        self.max_pieces = max_pieces
        added = dict(codec.tokenizer.added_tokens_decoder)
        plain = all(not (t.lstrip or t.rstrip or t.single_word or t.normalized) for t in added.values())
        self._split = None
        if added and plain and not codec.tokenizer.split_special_tokens:
            # longest first: at one place, the regex takes the first alternative that matches, as the tokenizer
            # takes the longest added token
            contents = sorted((t.content for t in added.values()), key=len, reverse=True)
            self._split = re.compile("(" + "|".join(re.escape(c) for c in contents) + ")")
        self._added = {t.content: i for i, t in added.items()}
        self._pieces: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        if self._split is not None:
            token = next(iter(self._added))
            probe = f"a{token}b {token} c\n{token}\n d{token}"
            if self._encode_pieces(probe) != codec.encode(probe):
                self._split = None
            self._pieces.clear()

    def prompt(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], pictures: list[Picture]) -> Encoded:
        """``ChatCodec.prompt``, its text encoded here (a prompt with pictures is the codec's own)."""
        if pictures:
            return self.codec.prompt(messages, tools, pictures)
        return self.codec.expand(self.encode(self.codec.render(messages, tools, add_generation_prompt=True)), ())

    def encode(self, text: str) -> list[int]:
        if self._split is None:
            return self.codec.encode(text)
        return self._encode_pieces(text)

    def _encode_pieces(self, text: str) -> list[int]:
        assert self._split is not None
        ids: list[int] = []
        for i, piece in enumerate(self._split.split(text)):
            if i % 2:  # an added token (split() puts the captured separators at the odd places)
                ids.append(self._added[piece])
            elif piece:
                ids += self._piece(piece)
        return ids

    def _piece(self, piece: str) -> tuple[int, ...]:
        ids = self._pieces.get(piece)
        if ids is not None:
            self._pieces.move_to_end(piece)
            return ids
        ids = tuple(self.codec.encode(piece))
        self._pieces[piece] = ids
        if len(self._pieces) > self.max_pieces:
            self._pieces.popitem(last=False)
        return ids
