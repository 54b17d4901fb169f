"""The GRPO group of the verl sample whose agent loop runs in the current task.

verl's loops call ``server_manager.generate(request_id, prompt_ids, ...)`` with no word of the sample's group, but
verl's ``AgentLoopWorker`` runs each sample's loop in a task of its own with the sample's columns, ``uid`` (the
GRPO group: the samples of one prompt) among them. ``RouterAgentLoopWorker`` (loops_manager.py) sets it for that
task here, and ``AgentloopLLMClient.generate`` passes it to the Router as ``GenerateCall.group_id``, so a group's
samples share a server and its prefill of their prompt.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

# a context variable, not a module global: each asyncio task sees only the value its own sample set
_GROUP: ContextVar[str] = ContextVar("agentloop_verl_sample_group", default="")


@contextlib.contextmanager
def sample_group(uid: object) -> Iterator[None]:
    """Within the block (in this task and the tasks it starts), calls belong to the GRPO group ``uid`` (None: no
    group)."""
    token = _GROUP.set("" if uid is None else str(uid))
    try:
        yield
    finally:
        _GROUP.reset(token)


def current_group() -> str:
    """The group of the sample this task runs ('' outside a sample's loop: placed as a group of one)."""
    return _GROUP.get()
