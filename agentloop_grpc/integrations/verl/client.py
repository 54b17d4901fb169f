"""verl's engine-level seam: an ``LLMServerClient`` whose ``generate`` reaches agentloop.v1 engines through our
Router, so verl's own agent loops (single-turn, tool) run unchanged on our engines.

verl's loops call ``server_manager.generate(request_id, prompt_ids=, sampling_params=, ...) -> TokenOutput``. Here
verl's request id is the Router's session (a tool loop's turns share it: they stick to one server and its prefix
cache), and the sample's ``uid`` its GRPO group where ``RouterAgentLoopWorker`` runs the loop (``sample_group.py``:
the group's samples share a server and its prefill of their prompt); verl's sampling dict is mapped key by key
(``sampling.py``), with the defaults verl's own servers take from the rollout config (``repetition_penalty``,
``ignore_eos``, the seed under ``full_determinism``) and their budget (the rollout's lengths by default, always
within the engine's context, at least one token); verl's priority is vLLM's (lower first), ours is negated; the ids
and logprobs are the engine's own; the finish maps to verl's stop reasons ('aborted' for an abort, as when
EngineControl Pause(ABORT) stops it, with the tokens so far; 'completed' otherwise); the weight versions of the
tokens go into ``extra_fields`` as verl's ``global_steps``/``min_global_steps``/``max_global_steps`` (verl's
staleness bookkeeping), the prefix-cache hit as ``num_cached_tokens``, failovers as ``num_preempted``. Pictures
(``image_data``: verl's prompt ids are already expanded by the processor) go as ``GenerateRequest.media``, each with
its span in the ids, found with the model's processor (``picture_spans.py``; the model is ``model_path=`` or verl's
``actor_rollout_ref.model.path``); videos, audio and processor arguments with pictures are refused by name
(agentloop.v1 does not carry them).

``AgentloopFullyAsyncLLMClient`` is verl's ``FullyAsyncLLMServerClient`` over the same calls: an aborted
generation is resumed from its tokens once the engines take requests again, invisibly to the loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import threading
from collections.abc import Sequence
from typing import Any

from verl.utils.rollout_trace import rollout_trace_op
from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient, LLMServerClient
from verl.workers.rollout.replica import TokenOutput

from agentloop_grpc.common.media import ImageExpander, MediaInput
from agentloop_grpc.common.types import FinishReason, SamplingParams
from agentloop_grpc.router import GenerateCall, Router, RouterConfig

from .picture_spans import PictureSpans
from .sample_group import current_group
from .sampling import sampling_from_verl

#: verl's version this was written and tested against (its client and agent-loop interfaces move between releases).
TESTED_VERL_VERSION = "0.9.1"


@dataclasses.dataclass(frozen=True, slots=True)
class _RolloutDefaults:
    """The rollout config's figures every call needs (verl's own servers take the same)."""

    #: Sampling params a call's dict does not set: repetition_penalty, ignore_eos, the seed under full_determinism.
    defaults: dict[str, Any]
    response_length: int
    prompt_length: int


class AgentloopLLMClient(LLMServerClient):
    """verl's LLM client over a Router to ``servers``, created in verl's event loop at the first call, so the client
    pickles to verl's Ray workers until then (and after: the Router stays behind). ``model_path`` (default: verl's
    ``actor_rollout_ref.model.path``) is the checkpoint whose processor finds the pictures' spans, loaded at the
    first call with pictures."""

    def __init__(self, config, load_balancer_handle=None, *, servers: Sequence[str] = (),
                 router_config: RouterConfig | None = None, model_path: str | None = None, **kwargs) -> None:
        super().__init__(config, load_balancer_handle)  # no balancer is used: the Router balances
        if not servers:
            raise ValueError("AgentloopLLMClient needs the engine servers' addresses (servers=...)")
        self._servers = list(servers)
        self._router_config = router_config
        self._router: Router | None = None
        self._router_lock: asyncio.Lock | None = None
        self._router_loop: asyncio.AbstractEventLoop | None = None
        model = config.get("actor_rollout_ref", {}).get("model", {}) or {}
        self._model_path = model_path or model.get("local_path") or model.get("path")
        self._picture_spans: PictureSpans | None = None
        self._picture_spans_loaded = False  # loaded once, also when the model has no processor for pictures
        self._picture_spans_lock = threading.Lock()
        self._rollout: _RolloutDefaults | None = None  # read from config at the first call

    def __getstate__(self) -> dict[str, Any]:
        # a Router holds channels bound to this process's event loop: a copy in another process opens its own; a
        # processor is reloaded there too, rather than pickled
        return {**self.__dict__, "_router": None, "_router_lock": None, "_router_loop": None,
                "_picture_spans": None, "_picture_spans_loaded": False, "_picture_spans_lock": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _picture_spans_lock=threading.Lock())

    async def router(self) -> Router:
        """The Router, once a server is ready (its context length bounds every budget, as verl's servers do). It
        belongs to the event loop of the first call: ``close()`` it in that loop before calling from another."""
        loop = asyncio.get_running_loop()
        if self._router is not None and self._router_loop is not loop:
            # gRPC channels serve the loop that opened them; used from another they fail with 'Event loop is closed'
            raise RuntimeError("AgentloopLLMClient's Router was opened in another event loop: await client.close() "
                               "in that loop before using the client from a new one (e.g. one asyncio.run per call)")
        if self._router is None:
            if self._router_loop is not loop:  # an asyncio lock, too, serves one loop
                self._router_lock, self._router_loop = asyncio.Lock(), loop
            # verl starts a worker's loops together: the first calls must wait for one Router, not open one each
            async with self._router_lock:
                if self._router is None:
                    router = await Router(self._servers, self._router_config).__aenter__()
                    try:
                        await router.fleet.wait_ready(timeout_s=router.config.no_server_wait_s)
                    except BaseException:  # no server came up: the next call tries afresh
                        await router.close()
                        raise
                    self._router = router
        return self._router

    async def close(self) -> None:
        router, self._router = self._router, None
        if router is not None:
            await router.close()

    def _rollout_defaults(self) -> _RolloutDefaults:
        """What every call takes from the rollout config, read at the first call: reads of verl's OmegaConf config
        are slow enough to show in the client's CPU per turn (agentloop_grpc/router/NOTES.md)."""
        if self._rollout is None:
            rollout = self.config.actor_rollout_ref.rollout
            defaults = {name: rollout.get(name) for name in ("repetition_penalty", "ignore_eos")
                        if rollout.get(name) is not None}
            if rollout.get("full_determinism") and rollout.get("seed") is not None:
                # verl seeds each replica; the Router may place a session on any server, so one seed for all
                defaults["seed"] = rollout.get("seed")
            self._rollout = _RolloutDefaults(defaults, rollout.response_length, rollout.prompt_length)
        return self._rollout

    def _sampling_params(self, params: dict[str, Any], prompt_len: int) -> SamplingParams:
        """Ours for verl's dict, with the defaults verl's own servers take from the rollout config."""
        rollout = self._rollout_defaults()
        # as verl's own servers: the response length, and never past the prompt + response budget
        budget = min(rollout.response_length, rollout.prompt_length + rollout.response_length - prompt_len)
        return sampling_from_verl({**rollout.defaults, **params}, max(1, budget))

    async def _media(self, prompt_ids: Sequence[int], pictures: Sequence[Any],
                     processor_kwargs: dict[str, Any] | None) -> tuple[MediaInput, ...]:
        """verl's pictures as media, their spans found in ``prompt_ids`` (off the event loop: the processor runs)."""
        if not pictures:
            return ()
        if processor_kwargs:
            # the engine expands each picture with its processor's defaults: other arguments would not match the ids
            raise ValueError(f"mm_processor_kwargs {sorted(processor_kwargs)}: agentloop.v1 carries no processor "
                             f"arguments with image_data (the engine's processor uses its defaults)")
        return await asyncio.to_thread(lambda: self._loaded_picture_spans().media(prompt_ids, pictures))

    def _loaded_picture_spans(self) -> PictureSpans:
        """The model's processor for pictures, loaded at the first call that has some."""
        with self._picture_spans_lock:
            if not self._picture_spans_loaded:
                path = self._model_path and os.path.expanduser(str(self._model_path))
                expander = ImageExpander.load(path) if path else None
                self._picture_spans = PictureSpans(expander) if expander is not None else None
                self._picture_spans_loaded = True
        if self._picture_spans is None:
            where = (f"the model at {self._model_path} has no processor that takes images" if self._model_path
                     else "no model path was given")
            raise ValueError(f"image_data: each picture's span in prompt_ids is found with the model's processor, "
                             f"and {where} (give AgentloopLLMClient model_path=, or actor_rollout_ref.model.path, "
                             f"a vision-language checkpoint)")
        return self._picture_spans

    @rollout_trace_op
    async def generate(
        self, request_id, *, prompt_ids: list[int], sampling_params: dict[str, Any], image_data=None,
        video_data=None, audio_data=None, mm_processor_kwargs=None, **kwargs: Any,
    ) -> TokenOutput:
        refused = {"video_data": video_data, "audio_data": audio_data,
                   "mm_processor_output": kwargs.pop("mm_processor_output", None)}
        if any(value for value in refused.values()):
            named = sorted(name for name, value in refused.items() if value)
            raise ValueError(f"{named}: agentloop.v1 carries pictures only (image_data), not videos, audio or "
                             f"processor outputs")
        # verl's priority is vLLM's, which schedules lower values first; agentloop.v1 schedules higher ones first
        priority = -int(kwargs.pop("priority", 0) or 0)
        if kwargs:
            raise ValueError(f"generate() arguments {sorted(kwargs)} have no agentloop.v1 equivalent")
        pictures = [] if image_data is None else image_data if isinstance(image_data, (list, tuple)) else [image_data]
        media = await self._media(prompt_ids, pictures, mm_processor_kwargs)  # one picture alone: as vLLM takes it
        sampling = self._sampling_params(sampling_params, len(prompt_ids))
        router = await self.router()
        # as verl's own servers: at least one token, at most what the context leaves (a prompt that leaves none
        # is the engine's INVALID_ARGUMENT)
        context = min(e.info.max_model_len for e in router.fleet.servers.values() if e.info is not None)
        budget = max(1, min(sampling.max_new_tokens, context - len(prompt_ids)))
        if budget != sampling.max_new_tokens:
            sampling = dataclasses.replace(sampling, max_new_tokens=budget)
        result = await router.generate(
            GenerateCall(session_id=str(request_id), prompt_ids=prompt_ids, sampling=sampling, priority=priority,
                         media=media, group_id=current_group())
        )
        versions = result.weight_versions or (router.fleet.weight_version,)
        # only fields that describe this call as a whole: verl's tool loop keeps the first call's extra fields
        # for the trajectory (updating max_global_steps alone), so a per-token list would cover its first turn only
        return TokenOutput(
            token_ids=list(result.token_ids),
            log_probs=list(result.logprobs) if sampling.logprobs else None,
            stop_reason="aborted" if result.finish_reason is FinishReason.ABORT else "completed",
            num_preempted=result.failovers,
            extra_fields={
                "global_steps": max(versions), "min_global_steps": min(versions), "max_global_steps": max(versions),
                "num_cached_tokens": result.cached_prompt_tokens,
            },
        )


class AgentloopFullyAsyncLLMClient(FullyAsyncLLMServerClient, AgentloopLLMClient):
    """verl's ``FullyAsyncLLMServerClient`` (partial rollout: an aborted generation resumes from its tokens, its
    budget reduced by them) whose every attempt is ``AgentloopLLMClient.generate``; engines paused with
    Pause(ABORT) hold the resumed attempt until Resume."""
