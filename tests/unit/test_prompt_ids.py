"""PromptIds: the prompt kept as the int32 bytes it arrived as, usable wherever a sequence of ints is."""

from __future__ import annotations

import pickle
import struct

import numpy as np
import pytest

from agentloop_grpc.common.prompt import PromptIds
from agentloop_grpc.common.types import GenerateRequest, SamplingParams

IDS = (5, 0, 49151, 17, 2**31 - 1)


def test_from_raw_reads_the_wire_bytes_without_unpacking_them() -> None:
    raw = struct.pack(f"<{len(IDS)}i", *IDS)
    prompt = PromptIds.from_raw(raw)
    assert prompt.raw == raw
    assert prompt == PromptIds(IDS) and prompt == IDS and prompt == list(IDS)
    assert prompt.numpy().dtype == np.dtype("<i4") and not prompt.numpy().flags.writeable


def test_behaves_as_a_sequence_of_python_ints() -> None:
    prompt = PromptIds(IDS)
    assert len(prompt) == 5 and prompt[2] == 49151 and prompt[-1] == 2**31 - 1
    assert all(type(token) is int for token in prompt) and list(prompt) == list(IDS)
    assert prompt[1:3] == (0, 49151) and isinstance(prompt[1:3], tuple)
    assert prompt.tolist() == list(IDS) and 17 in prompt and prompt.index(17) == 3
    assert np.asarray(prompt, dtype=np.int64).tolist() == list(IDS)
    assert prompt != (5, 0) and prompt != "x"


def test_equal_prompts_hash_equal_and_pickle_round_trips() -> None:
    a, b = PromptIds(IDS), PromptIds(list(IDS))
    assert hash(a) == hash(b) == hash(IDS) and len({a, b, IDS}) == 1
    assert pickle.loads(pickle.dumps(a)) == a


def test_ids_outside_int32_and_ragged_bytes_are_refused() -> None:
    with pytest.raises(ValueError, match="int32"):
        PromptIds([2**31])
    with pytest.raises(ValueError, match="int32"):
        PromptIds.from_raw(b"\x00" * 6)


def test_a_generate_request_keeps_any_sequence_as_prompt_ids() -> None:
    request = GenerateRequest("r", [1, 2, 3], SamplingParams(max_new_tokens=1))
    assert isinstance(request.prompt_ids, PromptIds) and request.prompt_ids == (1, 2, 3)
    same = PromptIds((1, 2, 3))
    assert GenerateRequest("r", same, SamplingParams(max_new_tokens=1)).prompt_ids is same
    assert request == GenerateRequest("r", (1, 2, 3), SamplingParams(max_new_tokens=1))


def test_np_array_copies_as_numpy_promises() -> None:
    prompt = PromptIds(IDS)
    copied = np.array(prompt)
    assert copied.flags.writeable and not np.shares_memory(copied, prompt.numpy())
    assert np.shares_memory(np.asarray(prompt), prompt.numpy())  # asarray may share: the zero-copy path
