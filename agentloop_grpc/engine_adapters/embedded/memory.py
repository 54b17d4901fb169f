"""Giving freed memory back to the operating system.

torch's CPU allocator sits on glibc malloc. Large buffers (the KV slots) are mmap-backed and return to the OS
when freed, but parameters of a few MB, prefix-cache blocks and safetensors' serialization buffer land on
malloc's heaps, whose free pages glibc keeps for reuse. Sleep must really free memory, so after dropping tensors
we ask glibc to trim (``malloc_trim(0)`` releases free pages anywhere in the heaps, not only at the top); the
RSS figures are in NOTES.md.
On a libc without ``malloc_trim`` (not glibc) the call is skipped and Sleep frees only the mmap-backed part.
On a GPU, torch's caching allocator keeps freed blocks for reuse, invisible to every other process: once CUDA is in
use, its cache is emptied too, so what Sleep dropped shows as free device memory.
"""

from __future__ import annotations

import ctypes
import gc

import torch


def trim() -> bool:
    """Collect garbage, then return free heap pages to the OS (and cached GPU blocks to the driver); True if the
    libc offered malloc_trim."""
    gc.collect()
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    try:
        malloc_trim = ctypes.CDLL(None).malloc_trim  # symbols of the running process, libc included
    except (AttributeError, OSError):
        return False
    malloc_trim(0)
    return True
