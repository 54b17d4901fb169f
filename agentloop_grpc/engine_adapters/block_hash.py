"""BlockChain: the prefix-cache keys of a token sequence's full blocks, shared by the fake and embedded engines.

Block i's key hashes block i-1's key with block i's token ids, so a key names the whole prefix up to its block's
end, as in vLLM and nano-vllm. The keys grow with the sequence: appending tokens hashes only the blocks they
complete, so a prompt is hashed once, at arrival, and its output once more when it is stored. The hash is
Python's own over the block's int32 bytes: fast, and enough for a cache inside one process (it is seeded per
process, so keys never leave it); a cache that must never serve a colliding prefix compares the block's ids too,
as the embedded engine's does.

Root: block 0's parent is the chain's ``root`` (None unless given). A cache that must never serve KV computed by
other weights roots its chains in a value it changes with the weights (the embedded engine's cache epoch), so a
prompt hashed after an update makes other keys from its first block on, and a comparing lookup, which checks each
block's parent, never reaches a block of before.

Images: a block that overlaps an image's span (``MediaInput``) also hashes the image's digest, so the same ids with
another picture make other keys from that block on, and ``block`` returns the digests after the ids, so a
comparing cache compares the pictures as well.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from agentloop_grpc.common.media import MediaInput
from agentloop_grpc.common.prompt import PromptIds


class BlockChain:
    """One sequence's token ids and the keys of its full blocks (see the module docstring)."""

    __slots__ = ("_images", "block_size", "ids", "keys", "root")

    def __init__(self, block_size: int, ids: PromptIds | Sequence[int] = (),
                 media: Sequence[MediaInput] = (), root: int | None = None) -> None:
        self.block_size = block_size
        self.root = root  # block 0's parent
        self.ids = b""  # every id appended so far, little-endian int32 (as PromptIds.raw)
        self.keys: list[int] = []
        #: block index -> the digests of the images its span overlaps, in order
        self._images: dict[int, bytes] = {}
        for item in media:
            digest = item.digest()
            for index in range(item.offset // block_size, (item.end - 1) // block_size + 1):
                self._images[index] = self._images.get(index, b"") + digest
        self.extend(ids)

    def __len__(self) -> int:
        """Tokens appended so far."""
        return len(self.ids) // 4

    def extend(self, ids: PromptIds | Sequence[int]) -> None:
        """Append ``ids`` and key the blocks they complete."""
        self.ids += ids.raw if isinstance(ids, PromptIds) else np.asarray(ids, dtype="<i4").tobytes()
        step = 4 * self.block_size
        parent = self.keys[-1] if self.keys else self.root
        for start in range(len(self.keys) * step, len(self.ids) - step + 1, step):
            images = self._images.get(start // step)
            block = self.ids[start : start + step]
            parent = hash((parent, block) if images is None else (parent, block, images))
            self.keys.append(parent)

    def block(self, index: int) -> bytes:
        """The int32 bytes of block ``index``, then the digests of the images it overlaps."""
        step = 4 * self.block_size
        return self.ids[index * step : (index + 1) * step] + self._images.get(index, b"")


def version_salt(weight_version: int) -> str:
    """The cache salt (vLLM's and SGLang's per-request ``cache_salt``) of requests run under ``weight_version``:
    those engines key a request's prefix blocks by it, so each version's blocks stay apart."""
    return f"agentloop-weights-{weight_version}"
