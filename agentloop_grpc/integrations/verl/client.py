"""verl's engine-level seam: an ``LLMServerClient`` whose ``generate`` reaches agentloop.v1 engines through our
Router, so verl's own agent loops (single-turn, tool) run unchanged on our engines.

verl's loops call ``server_manager.generate(request_id, prompt_ids=, sampling_params=, ...) -> TokenOutput``.
Here verl's request id is the Router's session (a tool loop's turns share it: they stick to one server and its
prefix cache); verl's sampling dict is mapped key by key (``sampling.py``); the ids and logprobs are the engine's
own; the finish maps to verl's stop reasons ('aborted' for an abort, 'completed' otherwise); the weight versions of
the tokens go into ``extra_fields`` as verl's ``min_global_steps``/``max_global_steps`` (verl's staleness
bookkeeping). Multi-modal inputs are refused by name (not carried by agentloop.v1 yet).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from verl.workers.rollout.llm_server import LLMServerClient
from verl.workers.rollout.replica import TokenOutput

from agentloop_grpc.common.types import FinishReason
from agentloop_grpc.router import GenerateCall, Router, RouterConfig

from .sampling import sampling_from_verl

#: verl's version this was written and tested against (its client and agent-loop interfaces move between releases).
TESTED_VERL_VERSION = "0.9.1"


class AgentloopLLMClient(LLMServerClient):
    """verl's LLM client over a Router to ``servers`` (created in verl's event loop at the first call)."""

    def __init__(self, config, load_balancer_handle=None, *, servers: Sequence[str] = (),
                 router_config: RouterConfig | None = None, **kwargs) -> None:
        super().__init__(config, load_balancer_handle)  # no balancer is used: the Router balances
        if not servers:
            raise ValueError("AgentloopLLMClient needs the engine servers' addresses (servers=...)")
        self._servers = list(servers)
        self._router_config = router_config
        self._router: Router | None = None

    async def router(self) -> Router:
        if self._router is None:
            self._router = await Router(self._servers, self._router_config).__aenter__()
        return self._router

    async def close(self) -> None:
        router, self._router = self._router, None
        if router is not None:
            await router.close()

    async def generate(
        self, request_id, *, prompt_ids: list[int], sampling_params: dict[str, Any], image_data=None,
        video_data=None, audio_data=None, mm_processor_kwargs=None, **kwargs: Any,
    ) -> TokenOutput:
        carried = {"image_data": image_data, "video_data": video_data, "audio_data": audio_data,
                   "mm_processor_output": kwargs.pop("mm_processor_output", None)}
        if any(value for value in carried.values()):
            named = sorted(name for name, value in carried.items() if value)
            raise ValueError(f"{named}: multi-modal inputs are not carried by agentloop.v1 yet")
        priority = int(kwargs.pop("priority", 0) or 0)
        if kwargs:
            raise ValueError(f"generate() arguments {sorted(kwargs)} have no agentloop.v1 equivalent")
        rollout = self.config.actor_rollout_ref.rollout
        # as verl's own servers: the response length, and never past the prompt + response budget
        budget = min(rollout.response_length, rollout.prompt_length + rollout.response_length - len(prompt_ids))
        sampling = sampling_from_verl(sampling_params, max(1, budget))
        router = await self.router()
        result = await router.generate(
            GenerateCall(session_id=str(request_id), prompt_ids=prompt_ids, sampling=sampling, priority=priority)
        )
        versions = result.weight_versions or (0,)
        return TokenOutput(
            token_ids=list(result.token_ids),
            log_probs=list(result.logprobs) if sampling.logprobs else None,
            stop_reason="aborted" if result.finish_reason is FinishReason.ABORT else "completed",
            num_preempted=result.failovers,
            extra_fields={
                "global_steps": max(versions), "min_global_steps": min(versions), "max_global_steps": max(versions),
                "weight_versions": list(result.weight_versions), "finish_reason": result.finish_reason.value,
            },
        )
