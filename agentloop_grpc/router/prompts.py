"""PromptPacker: prompts as GenerateRequest.prompt_ids_raw (little-endian int32), packed as little as possible.

Packing Python ints into int32 bytes is the largest part of a generate call's client CPU (figures in NOTES.md).
Two cases avoid it:

- a prompt that already holds int32 bytes (``PromptIds``, an ``array('i')``) is sent as its bytes;
- an agent loop's next turn extends the session's previous prompt (previous prompt + response + observation): the
  packer remembers each session's last prompt (a private copy, with its bytes) and packs only the new suffix. The
  check is exact, a comparison of the whole remembered prefix (the caller may have mutated its list since), and
  costs less than packing it. Memory is bounded by ``max_ids`` remembered ids over all sessions (least recently
  used sessions forgotten first).

A remembered prefix compares equal, element by element, to the new one: a value that equals an int (``5.0``) is
then sent as that int, where packing it alone would have refused it.
"""

from __future__ import annotations

import sys
from array import array
from collections import OrderedDict
from collections.abc import Sequence

from agentloop_grpc.common import wire
from agentloop_grpc.common.prompt import PromptIds

_LITTLE_ENDIAN = sys.byteorder == "little"

#: A prompt as it goes on the wire: int32 bytes, or (ids outside int32) a private list for the repeated field,
#: which refuses them.
WirePrompt = bytes | list[int]


class PromptPacker:
    """Packs prompts, remembering each session's last one; see the module docstring."""

    def __init__(self, max_ids: int) -> None:
        self._max_ids = max_ids
        self._known: OrderedDict[str, tuple[list[int], bytes]] = OrderedDict()  # session -> (ids, their bytes)
        self._held = 0  # ids in _known

    def pack(self, session_id: str, prompt_ids: Sequence[int]) -> WirePrompt:
        """The prompt's wire form, never sharing anything the caller may modify later."""
        if isinstance(prompt_ids, PromptIds):
            return prompt_ids.raw
        if isinstance(prompt_ids, array) and prompt_ids.typecode == "i" and prompt_ids.itemsize == 4:
            if _LITTLE_ENDIAN:
                return prompt_ids.tobytes()
            swapped = array("i", prompt_ids)
            swapped.byteswap()
            return swapped.tobytes()
        if not isinstance(prompt_ids, (list, tuple)) or not self._max_ids:
            return _packed(list(prompt_ids))
        if isinstance(prompt_ids, tuple):
            prompt_ids = list(prompt_ids)  # compared below with a list, which never equals a tuple
        known = self._known.pop(session_id, None)
        raw = None
        if known is not None:
            ids, known_raw = known
            self._held -= len(ids)
            tail = prompt_ids[len(ids) :]
            ids += tail  # the remembered copy is ours to extend: comparing it whole copies nothing more
            if ids == prompt_ids:
                packed_tail = wire.prompt_to_raw(tail) if tail else b""
                raw = None if packed_tail is None else known_raw + packed_tail
        if raw is None:
            ids = list(prompt_ids)
            raw = wire.prompt_to_raw(ids)
        if raw is None:
            return ids
        self._remember(session_id, ids, raw)
        return raw

    def forget(self, session_id: str) -> None:
        known = self._known.pop(session_id, None)
        if known is not None:
            self._held -= len(known[0])

    def _remember(self, session_id: str, ids: list[int], raw: bytes) -> None:
        if len(ids) > self._max_ids:
            return
        self._known[session_id] = (ids, raw)
        self._held += len(ids)
        while self._held > self._max_ids:
            evicted, _ = self._known.popitem(last=False)[1]
            self._held -= len(evicted)


def _packed(ids: list[int]) -> WirePrompt:
    raw = wire.prompt_to_raw(ids)
    return ids if raw is None else raw


def extended(prompt: WirePrompt, tokens: list[int]) -> WirePrompt:
    """The prompt of a resumed attempt: the original one followed by the tokens already received."""
    if not tokens:
        return prompt
    if isinstance(prompt, bytes):
        return prompt + wire.prompt_to_raw(tokens)  # generated ids are int32 (the wire's type)
    return prompt + tokens


def prompt_length(prompt: WirePrompt) -> int:
    return len(prompt) // 4 if isinstance(prompt, bytes) else len(prompt)
