"""The SGLang surface this adapter uses, pinned to sglang 0.5.23, with where each fact comes from.

Everything the actor touches in sglang's module namespace is gathered in ``SglangApi`` (the engine class, the
request objects of the control calls, the tensor serializer, the version), built by ``SglangApi.load()`` where
sglang is installed. The actor receives it as a value, so tests give it a stand-in one explicitly (no module
patching) and the mapping code is the same in both cases.

Why the actor calls ``engine.tokenizer_manager`` for control, not ``Engine``'s own methods: the actor is a Ray
*async* actor (it streams tokens), so its methods run inside a running event loop, and ``sgl.Engine`` created
there takes that loop as ``Engine.loop`` (``Engine._ensure_event_loop``: ``asyncio.get_running_loop()``).
``Engine.flush_cache``, ``release_memory_occupation``, ``resume_memory_occupation``,
``update_weights_from_tensor`` and ``get_server_info`` are synchronous wrappers that call
``self.loop.run_until_complete(self.tokenizer_manager.<method>(...))``, which raises on a loop that is already
running. So the actor awaits the same ``TokenizerManager`` coroutines those wrappers run, with the same request
objects; ``Engine.async_generate`` is already a coroutine and is used as is.

Facts relied on (sglang 0.5.23 wheel from PyPI, ``python/sglang/srt/...``):

- ``entrypoints/engine.py`` ``Engine.__init__(**kwargs)``: kwargs are ``ServerArgs`` fields (``model_path``,
  ``tp_size``, ``enable_memory_saver``, ...).
- ``Engine.async_generate(prompt=None, sampling_params=None, input_ids=None, ..., return_logprob=False,
  logprob_start_len=None, top_logprobs_num=None, ..., stream=False, ..., rid=None, ...)``: with ``stream=True``
  it returns ``tokenizer_manager.generate_request(obj)``, an async generator of dicts
  ``{"text", "output_ids", "meta_info"}``.
- ``managers/io_struct.py`` ``GenerateReqInput.logprob_start_len``: ``-1`` (the default) returns logprobs of
  output tokens only.
- ``managers/tokenizer_manager.py`` ``_handle_batch_output``: ``meta_info`` carries ``prompt_tokens``,
  ``completion_tokens`` (cumulative), ``cached_tokens``, ``finish_reason`` (None, or a dict ``{"type": "stop",
  "matched": int | list | str}``, ``{"type": "length", "length": n}``, ``{"type": "abort", "message",
  "status_code", "err_type}``; ``managers/schedule_batch.py`` ``FINISH_*.to_json``), and when logprobs are
  asked ``output_token_logprobs`` / ``output_top_logprobs`` as ``(logprob, token_id, text_or_None)`` tuples.
  While streaming, ``output_ids`` and the logprob lists are cumulative unless the server runs with
  ``incremental_streaming_output``, in which case they are the new part only (``outputs.py`` reads both).
- A request that SGLang rejects (for instance a grammar its backend cannot compile) ends with an abort
  finish reason whose ``status_code`` is 400 (``TokenizerManager._handle_abort_finish_reason``).
- ``TokenizerManager.abort_request(rid="", abort_all=False)`` (synchronous; an empty rid without abort_all is
  ignored).
- ``TokenizerManager.pause_generation(PauseGenerationReqInput(mode="abort" | "retract" | "in_place"))`` and
  ``continue_generation(ContinueGenerationReqInput())``; ``in_place`` keeps requests and their KV in the running
  batch (and makes ``flush_cache`` fail while any request is running).
- ``TokenizerManager.release_memory_occupation(ReleaseMemoryOccupationReqInput(tags=...), None)`` and
  ``resume_memory_occupation(ResumeMemoryOccupationReqInput(tags=...), None)``; tags ``"weights"`` and
  ``"kv_cache"`` (``constants.py`` GPU_MEMORY_TYPE_*; needs ``enable_memory_saver=True``).
- ``TokenizerManager.update_weights_from_tensor(UpdateWeightsFromTensorReqInput(serialized_named_tensors=[one
  MultiprocessingSerializer.serialize(named_tensors) per TP rank], flush_cache=..., weight_version=str), None)
  -> (success, message)``: what ``Engine.update_weights_from_tensor(named_tensors, load_format=None,
  flush_cache=True)`` does (``Engine._serialize_tensors_per_rank``).
- ``TokenizerManager.update_weights_from_disk(UpdateWeightFromDiskReqInput(model_path=..., load_format=...,
  flush_cache=..., weight_version=str), None) -> (success, message, num_paused_requests)``: what
  ``Engine.update_weights_from_disk(model_path, load_format=None)`` runs. ``model_path`` is a model folder: the
  scheduler's ``ModelRunner.update_weights_from_disk`` points ``model_config.model_path`` at it and reads it with
  ``DefaultModelLoader`` (``*.safetensors`` for ``load_format="safetensors"``, filtered by a
  ``model.safetensors.index.json`` when the folder has one); a failure answers ``(False, "Failed to ...")``.
- ``TokenizerManager.flush_cache() -> FlushCacheReqOutput(success=...)``.
- ``TokenizerManager.get_loads(include=None, dp_rank=None) -> list[LoadSnapshot]`` with ``num_running_reqs``,
  ``num_waiting_reqs``, ``token_usage``, ``cache_hit_rate``, ``max_running_requests``
  (``managers/load_snapshot.py``).
- ``TokenizerManager.context_len``, ``.model_config.vocab_size``, ``.model_config.hf_eos_token_id`` (a set),
  ``.tokenizer`` (a Hugging Face tokenizer) and ``.config_value(name)`` (the value in effect of a server argument,
  e.g. ``"enable_memory_saver"``; 0.5.23 moved server arguments into namespaced groups).
- Images: ``Engine.async_generate(..., image_data=[...])`` takes per request a list of images (a PIL image, a file
  name, a URL or a base64 string such as a ``data:image/png;base64,...`` URL; ``io_struct.py`` ``GenerateReqInput``).
  Given ``input_ids``, ``TokenizerManager._tokenize_one_request`` hands them with ``image_data`` to the model's
  multi-modal processor, which decodes the ids to text and runs the Hugging Face processor on it with the images
  (``multimodal/processors/base_processor.py`` ``load_mm_data`` / ``process_and_combine_mm_data``); its
  ``input_ids`` replace the request's. The Hugging Face processor expands every image placeholder it finds, so a
  span sent already expanded would be expanded again (Idefics3: each ``<image>`` id read as one more image; only
  Qwen-VL's processor matches an expanded ``<|vision_start|>(<|image_pad|>)+<|vision_end|>`` run by a regex), and
  ``SGLANG_MM_AVOID_RETOKENIZE`` (keep the request's ids, expand each placeholder id in place) needs one id per
  image as well: the adapter collapses each span to ``model_config.hf_config.image_token_id``, the id those
  processors expand. ``model_config.is_multimodal`` says whether the model takes images. SGLang reports no prompt
  ids, only ``meta_info["prompt_tokens"]``: the actor checks that count equals the request's length before any
  token leaves (decode-then-retokenize may also change ids without changing the count: unchecked; not run on a
  real SGLang here, no GPU).
- Routed experts: the server argument ``enable_return_routed_experts`` and ``async_generate(...,
  return_routed_experts=True)``; the finished output's ``meta_info["routed_experts"]`` (``routing.py`` cites the
  layout); ``TokenizerManager.model_config.hf_text_config`` is the model's Hugging Face text config.
- ``sampling/sampling_params.py`` ``SamplingParams``: ``max_new_tokens``, ``temperature``, ``top_p``, ``top_k``
  (-1: whole vocabulary), ``min_p``, ``frequency_penalty``, ``presence_penalty``, ``repetition_penalty``,
  ``stop_token_ids``, ``ignore_eos``, ``no_stop_trim``, ``sampling_seed``, ``json_schema``, ``regex``, ``ebnf``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: The SGLang release this adapter was written against; other 0.5.x releases differ in server-argument access.
TARGET_VERSION = "0.5.23"


@dataclass(frozen=True, slots=True)
class SglangApi:
    """SGLang's engine class, control request types and tensor serializer (see the module docstring)."""

    version: str
    #: ``sglang.Engine``: called with the actor's engine kwargs.
    engine_class: Callable[..., Any]
    pause_request: Callable[..., Any]
    continue_request: Callable[..., Any]
    release_memory_request: Callable[..., Any]
    resume_memory_request: Callable[..., Any]
    update_weights_request: Callable[..., Any]
    update_disk_request: Callable[..., Any]
    #: ``MultiprocessingSerializer.serialize``: a list of (name, torch.Tensor) to the bytes one TP rank loads.
    serialize_tensors: Callable[[Any], bytes]

    @classmethod
    def load(cls) -> SglangApi:
        """The real SGLang (imported here: only the rank-0 actor's process needs sglang installed)."""
        import sglang
        from sglang.srt.managers import io_struct
        from sglang.srt.utils import MultiprocessingSerializer

        return cls(
            version=sglang.__version__,
            engine_class=sglang.Engine,
            pause_request=io_struct.PauseGenerationReqInput,
            continue_request=io_struct.ContinueGenerationReqInput,
            release_memory_request=io_struct.ReleaseMemoryOccupationReqInput,
            resume_memory_request=io_struct.ResumeMemoryOccupationReqInput,
            update_weights_request=io_struct.UpdateWeightsFromTensorReqInput,
            update_disk_request=io_struct.UpdateWeightFromDiskReqInput,
            serialize_tensors=MultiprocessingSerializer.serialize,
        )
