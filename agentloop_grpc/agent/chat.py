"""ChatCodec: turns messages into token ids the way the chat template renders them, by deltas.

The loop never re-tokenizes model output. Everything it adds between model turns (tool responses, user turns) is
encoded as the template's *delta*: the text the template puts after the model's last turn, found by rendering
that turn as a sentinel and taking what follows it. The delta depends neither on how the template re-renders
earlier turns (Qwen3's drops the reasoning of turns before the last user query, others trim content or
re-serialise tool calls) nor on a render of the past being a prefix of its continuation, so the next prompt
continues exactly what the engine saw.

The turn separator: a template closes an assistant turn with text after the end-of-turn token (ChatML:
``<|im_end|>`` then ``\n``). The model stops at ``<|im_end|>``; the ``\n`` is the template's, not the model's,
and it must still be there before the next turn (verl #6501 dropped it). The text after the sentinel starts with
that tail, and the loop drops from it only the stop token the model did produce.

Drift check: ``first_drift`` re-renders the whole conversation and compares it with the recorded ids. The first
difference is classified: ``tokenization`` when the recorded ids decode to the rendered text (the model produced
a non-canonical tokenization of its own text: harmless, the ids are the truth), ``text`` when the template renders
something else (a template that re-renders past turns differently, or a wrong delta: a trainer that re-templates
the conversation would train on other tokens). Modes: strict (the trajectory fails), report (recorded in it), off.

Images: a template renders an image part as the processor's image token, and ``expand`` replaces each such id
of the encoding by the processor's expansion of the next picture (the ids the model runs), recording the span of
each (``Encoded.media``). A count of placeholders other than the count of pictures (a message's text that types the
image token itself) is an ImageError: the ids would not say which picture is where. A codec without an
``ImageExpander`` (a text-only model) refuses pictures and encodes text exactly as before.

The template is the loop's alone (engines take token ids): the tokenizer's own, or ``AgentLoopConfig.chat_template``
with ``chat_template_kwargs`` passed to every render. The tokenizer is only read (``apply_chat_template``,
``encode``, ``decode``); nothing here mutates it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jinja2 import TemplateError

from agentloop_grpc.common.media import ImageError, ImageExpander, MediaInput

if TYPE_CHECKING:  # importing transformers takes a second: `agentloop --help` and servers never need it
    from transformers import PreTrainedTokenizerBase

from .images import Picture
from .trajectory import Drift, DriftKind

_SENTINEL = "\u2063agentloop-sentinel\u2063"
#: The template variable that turns a model's thinking mode on or off (Qwen3's, and the templates following it).
THINKING_SWITCH = "enable_thinking"
#: Characters of each text shown either side of a drift.
_DRIFT_CONTEXT_CHARS = 60


@dataclass(frozen=True, slots=True)
class Encoded:
    """Token ids and the spans of the pictures in them (offsets into ``ids``)."""

    ids: list[int]
    media: tuple[MediaInput, ...] = ()


class ChatCodec:
    """Renders and encodes conversations for one tokenizer and chat template (and the model's image processor,
    when it takes images)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, chat_template: str | None = None,
                 template_kwargs: Mapping[str, Any] | None = None, images: ImageExpander | None = None) -> None:
        self.tokenizer = tokenizer
        self.images = images
        self._template = chat_template  # None: the tokenizer's own
        self._template_kwargs = dict(template_kwargs or {})
        self.eos_token_ids = tuple(
            sorted({i for i in (tokenizer.eos_token_id, tokenizer.pad_token_id) if i is not None})
        )
        try:
            closed = self.render([{"role": "user", "content": "x"}, {"role": "assistant", "content": _SENTINEL}])
        except TemplateError as error:  # a broken template fails when the worker is built, not in the first loop
            raise ValueError(f"chat_template: the template does not render a conversation ({error})") from None
        self._assistant_tail = self._after_sentinel(closed)

    def render(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict] | None = None, *,
               add_generation_prompt: bool = False) -> str:
        return self.tokenizer.apply_chat_template(
            list(messages),
            tools=list(tools) if tools else None,
            chat_template=self._template,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            **self._template_kwargs,
        )

    @property
    def thinking_switch(self) -> bool:
        """Whether the template has a thinking mode to switch (it reads ``enable_thinking``) that this codec's
        kwargs leave free."""
        source = self._template if self._template is not None else self.tokenizer.chat_template
        return (isinstance(source, str) and THINKING_SWITCH in source
                and THINKING_SWITCH not in self._template_kwargs)

    def with_thinking(self, enabled: bool) -> ChatCodec:
        """The same tokenizer and template with the thinking mode switched on or off."""
        return ChatCodec(self.tokenizer, self._template, {**self._template_kwargs, THINKING_SWITCH: enabled},
                         self.images)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=False)

    def prompt_ids(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict] | None = None) -> list[int]:
        """The first prompt: the conversation so far, opened for the assistant."""
        return self.encode(self.render(messages, tools, add_generation_prompt=True))

    def expand(self, ids: Sequence[int], pictures: Sequence[Picture]) -> Encoded:
        """``ids`` with each image placeholder replaced by the processor's expansion of the next picture."""
        self._sees(pictures)
        if self.images is None:
            return Encoded(list(ids))
        token = self.images.image_token_id
        places = [i for i, t in enumerate(ids) if t == token]
        if len(places) != len(pictures):
            raise ImageError(f"the text renders {len(places)} image placeholders for {len(pictures)} images: "
                             f"a message's text may not contain {self.images.image_token!r} itself")
        out: list[int] = []
        media = []
        start = 0
        for place, picture in zip(places, pictures, strict=True):
            out += ids[start:place]
            expansion = self.images.expand(picture.image).ids
            media.append(MediaInput(picture.mime_type, picture.data, len(out), len(expansion)))
            out += expansion
            start = place + 1
        return Encoded(out + list(ids[start:]), tuple(media))

    def _sees(self, pictures: Sequence[Picture]) -> None:
        # checked before rendering: a text-only template may not render image parts at all
        if pictures and self.images is None:
            raise ImageError(f"{len(pictures)} images, and the model has no image processor (a text-only model)")

    def prompt(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict] | None,
               pictures: Sequence[Picture] = ()) -> Encoded:
        """``prompt_ids`` with the pictures of ``messages`` (their template view) expanded in place."""
        self._sees(pictures)
        return self.expand(self.prompt_ids(messages, tools), pictures)

    def assistant_text(self, token_ids: Sequence[int], stopped_on: int | None) -> str:
        """The text of one model turn for the conversation: its tokens decoded, without the stop token."""
        ids = list(token_ids)
        if stopped_on is not None and ids and ids[-1] == stopped_on:
            ids = ids[:-1]
        return self.decode(ids)

    def separator(self, stopped_on: int | None) -> str:
        """What the template puts after an assistant turn that the model did not produce itself."""
        return self._not_produced(self._assistant_tail, stopped_on)

    def _not_produced(self, tail: str, stopped_on: int | None) -> str:
        if stopped_on is not None:
            stop_text = self.decode([stopped_on])
            if tail.startswith(stop_text):
                return tail[len(stop_text) :]
        return tail

    @staticmethod
    def _after_sentinel(text: str) -> str:
        at = text.find(_SENTINEL)
        if at < 0:
            raise ValueError("chat_template: the template does not render an assistant turn's content, so the loop "
                             "cannot tell where the model's tokens end")
        return text[at + len(_SENTINEL) :]

    def delta_ids(
        self,
        history: Sequence[dict[str, Any]],
        new_messages: Sequence[dict[str, Any]],
        tools: Sequence[dict] | None,
        stopped_on: int | None,
    ) -> list[int]:
        """Token ids to append after the model's last turn (the last message of ``history``) so that the
        conversation continues with ``new_messages`` and is opened for the assistant again."""
        if not history or history[-1].get("role") != "assistant":
            raise ValueError("a delta continues an assistant turn: the last message of history must be one")
        probe = [*history[:-1], {**history[-1], "content": _SENTINEL}, *new_messages]
        after = self._after_sentinel(self.render(probe, tools, add_generation_prompt=True))
        return self.encode(self._not_produced(after, stopped_on))

    def delta(self, history: Sequence[dict[str, Any]], new_messages: Sequence[dict[str, Any]],
              tools: Sequence[dict] | None, stopped_on: int | None, pictures: Sequence[Picture] = ()) -> Encoded:
        """``delta_ids`` with the pictures of ``new_messages`` expanded in place."""
        self._sees(pictures)
        return self.expand(self.delta_ids(history, new_messages, tools, stopped_on), pictures)

    def first_drift(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict] | None, recorded: Sequence[int],
        open_for_assistant: bool, pictures: Sequence[Picture] = (),
    ) -> Drift | None:
        """Compare ``recorded`` (prompt + response ids) with a fresh render of ``messages`` (their pictures
        expanded); None when it is a prefix of the render (the render may go on with the last turn's separator),
        else the first difference, classified (see the module docstring)."""
        recorded = list(recorded)
        rendered_text = self.render(messages, tools, add_generation_prompt=open_for_assistant)
        rendered = self.expand(self.encode(rendered_text), pictures).ids
        if recorded == rendered[: len(recorded)]:
            return None
        if pictures:  # texts compare with the pictures' expansions in both, as the recorded ids decode
            rendered_text = self.decode(rendered)
        recorded_text = self.decode(recorded)
        kind: DriftKind
        if rendered_text.startswith(recorded_text):
            kind = "tokenization"
            position = next(i for i, token in enumerate(recorded) if i >= len(rendered) or rendered[i] != token)
            offset = len(self.decode(recorded[:position]))
        else:
            kind = "text"
            offset = _common_prefix(recorded_text, rendered_text)
            position = self._token_at(recorded, rendered_text)
        lo, hi = max(0, offset - _DRIFT_CONTEXT_CHARS), offset + _DRIFT_CONTEXT_CHARS
        return Drift(
            position,
            recorded[position] if position < len(recorded) else None,
            rendered[position] if position < len(rendered) else None,
            kind=kind,
            recorded_text=recorded_text[lo:hi],
            rendered_text=rendered_text[lo:hi],
        )

    def _token_at(self, recorded: list[int], rendered_text: str) -> int:
        """The first recorded token whose text takes the decoded sequence off ``rendered_text`` (binary search:
        the decoded prefixes stay prefixes of the render up to that token, and none does after it)."""
        lo, hi = 0, len(recorded)  # decode(recorded[:lo]) is a prefix of the render, decode(recorded[:hi]) is not
        while hi - lo > 1:
            middle = (lo + hi) // 2
            if rendered_text.startswith(self.decode(recorded[:middle])):
                lo = middle
            else:
                hi = middle
        return lo


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)
