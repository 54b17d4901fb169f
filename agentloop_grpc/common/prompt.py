"""PromptIds: a request's prompt as the int32 ids it arrived as, read-only.

A 2,000-id prompt arrives as 8 KB of little-endian int32 (``GenerateRequest.prompt_ids_raw``). Unpacking it into
a tuple of Python ints, and hashing that tuple, cost the server CPU on every call. PromptIds keeps the bytes: it
is a ``Sequence[int]`` (len, indexing and iteration give Python ints, a slice gives a tuple), ``numpy()`` is a
zero-copy int32 view, and ``tolist()`` gives a list of Python ints in one C call. Ids are int32, as on the wire;
every vocabulary fits.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, overload

import numpy as np

_LITTLE_ENDIAN = sys.byteorder == "little"


class PromptIds(Sequence[int]):
    """Token ids of a prompt, immutable and hashable; see the module docstring."""

    __slots__ = ("_ids", "_raw")

    def __init__(self, ids: Iterable[int]) -> None:
        values = ids if isinstance(ids, (list, tuple)) else list(ids)
        try:
            raw = struct.pack(f"<{len(values)}i", *values)
        except struct.error as exc:
            raise ValueError(f"prompt ids must be int32: {exc}") from exc
        self._set(raw)

    @classmethod
    def from_raw(cls, raw: bytes) -> PromptIds:
        """From little-endian int32 bytes (``GenerateRequest.prompt_ids_raw``), without unpacking them."""
        if len(raw) % 4:
            raise ValueError(f"{len(raw)} bytes is not a whole number of int32 ids")
        prompt = cls.__new__(cls)
        prompt._set(bytes(raw))
        return prompt

    def _set(self, raw: bytes) -> None:
        self._raw = raw
        if _LITTLE_ENDIAN:
            self._ids = memoryview(raw).cast("i")
        else:  # the bytes stay little-endian (``raw``); the view must be native
            native = array("i", raw)
            native.byteswap()
            self._ids = memoryview(native)

    @property
    def raw(self) -> bytes:
        """The ids as little-endian int32 bytes (the wire form)."""
        return self._raw

    def numpy(self) -> np.ndarray:
        """A read-only int32 view of the ids (no copy)."""
        return np.frombuffer(self._raw, dtype="<i4")

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        view = self.numpy()
        if dtype is not None:
            return view.astype(dtype)  # a new array
        return view.copy() if copy else view  # np.array asks for a copy (copy=True); np.asarray may share

    def tolist(self) -> list[int]:
        return self._ids.tolist()

    def __len__(self) -> int:
        return len(self._ids)

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[int, ...]: ...

    def __getitem__(self, index: int | slice) -> int | tuple[int, ...]:
        if isinstance(index, slice):
            return tuple(self._ids[index].tolist())
        return self._ids[index]

    def __iter__(self) -> Iterator[int]:
        return iter(self._ids)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PromptIds):
            return self._raw == other._raw
        if isinstance(other, (tuple, list)):
            return self._ids.tolist() == list(other)
        return NotImplemented

    def __hash__(self) -> int:
        # equal to a tuple of the same ids (__eq__), so it must hash like one; nothing on the hot path hashes it
        return hash(tuple(self._ids.tolist()))

    def __repr__(self) -> str:
        return f"PromptIds({self._ids.tolist()!r})"

    def __reduce__(self) -> tuple[Callable[[bytes], PromptIds], tuple[bytes]]:
        return PromptIds.from_raw, (self._raw,)
