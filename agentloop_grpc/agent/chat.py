"""ChatCodec: turns messages into token ids the way the chat template renders them, by deltas.

The loop never re-tokenizes model output. Everything it adds between model turns (tool responses, user turns) is
encoded as the template's *delta*: render the conversation with and without the new messages and encode only the
difference, so the tokens equal what the template would produce at that spot.

The turn separator: a template closes an assistant turn with text after the end-of-turn token (ChatML:
``<|im_end|>`` then ``\n``). The model stops at ``<|im_end|>``; the ``\n`` is the template's, not the model's,
and it must still be there before the next turn (verl #6501 dropped it). ``separator()`` finds that tail by
rendering a sentinel assistant turn, and the loop prepends what the model did not produce to the next delta.

Drift check: ``first_drift`` re-renders the whole conversation and compares it with the recorded ids. A
difference means the template would not reproduce what was trained on, either because the model produced a
non-canonical tokenization of its own text (harmless for training, the ids are the truth) or because a delta was
wrong (a bug). Modes: strict (the trajectory fails), report (recorded in it), off.

The tokenizer is only read (``apply_chat_template``, ``encode``, ``decode``); nothing here mutates it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from transformers import PreTrainedTokenizerBase

from .trajectory import Drift

_SENTINEL = "\u2063agentloop-sentinel\u2063"


class ChatCodec:
    """Renders and encodes conversations for one tokenizer and chat template."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, chat_template: str | None = None) -> None:
        self.tokenizer = tokenizer
        self._template = chat_template  # None: the tokenizer's own
        self.eos_token_ids = tuple(
            sorted({i for i in (tokenizer.eos_token_id, tokenizer.pad_token_id) if i is not None})
        )
        closed = self.render([{"role": "user", "content": "x"}, {"role": "assistant", "content": _SENTINEL}])
        self._assistant_tail = closed[closed.index(_SENTINEL) + len(_SENTINEL) :]

    def render(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict] | None = None, *,
               add_generation_prompt: bool = False) -> str:
        return self.tokenizer.apply_chat_template(
            list(messages),
            tools=list(tools) if tools else None,
            chat_template=self._template,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
        )

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=False)

    def prompt_ids(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict] | None = None) -> list[int]:
        """The first prompt: the conversation so far, opened for the assistant."""
        return self.encode(self.render(messages, tools, add_generation_prompt=True))

    def assistant_text(self, token_ids: Sequence[int], stopped_on: int | None) -> str:
        """The text of one model turn for the conversation: its tokens decoded, without the stop token."""
        ids = list(token_ids)
        if stopped_on is not None and ids and ids[-1] == stopped_on:
            ids = ids[:-1]
        return self.decode(ids)

    def separator(self, stopped_on: int | None) -> str:
        """What the template puts after an assistant turn that the model did not produce itself."""
        if stopped_on is not None:
            stop_text = self.decode([stopped_on])
            if self._assistant_tail.startswith(stop_text):
                return self._assistant_tail[len(stop_text) :]
        return self._assistant_tail

    def delta_ids(
        self,
        history: Sequence[dict[str, Any]],
        new_messages: Sequence[dict[str, Any]],
        tools: Sequence[dict] | None,
        stopped_on: int | None,
    ) -> list[int]:
        """Token ids to append after the model's last turn (the last message of ``history``) so that the
        conversation continues with ``new_messages`` and is opened for the assistant again."""
        before = self.render(history, tools)
        after = self.render([*history, *new_messages], tools, add_generation_prompt=True)
        if not after.startswith(before):
            raise ValueError("the chat template does not render the conversation as a prefix of its continuation")
        return self.encode(self.separator(stopped_on) + after[len(before) :])

    def first_drift(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict] | None, recorded: Sequence[int],
        open_for_assistant: bool,
    ) -> Drift | None:
        """Compare ``recorded`` (prompt + response ids) with a fresh render of ``messages``; None when it is a
        prefix of the render (the render may go on with the last turn's separator)."""
        rendered = self.encode(self.render(messages, tools, add_generation_prompt=open_for_assistant))
        for position, token in enumerate(recorded):
            if position >= len(rendered) or rendered[position] != token:
                return Drift(position, token, rendered[position] if position < len(rendered) else None)
        return None
