"""The engine's load as vLLM's scheduler reports it, for GetLoad.

vLLM's EngineCore sends ``SchedulerStats`` (running and waiting requests, KV-cache usage, prefix-cache queries
and hits) with its outputs; ``AsyncLLM`` hands them to its stat loggers. ``SchedulerStatsRecorder`` is such a
logger: it keeps the latest snapshot and the cumulative prefix-cache counters in a ``SchedulerLoad`` the adapter
owns, so GetLoad costs no call into the engine process.

The stats arrive with a step's outputs, so after the last request of a burst ends they may still count it; the
adapter therefore takes the number of requests in the engine from its own bookkeeping and uses the scheduler's
figures only to split them into running and waiting.

Preemptions: vLLM's scheduler records a PREEMPTED event on a request it preempts (KV pressure, or a prefix-cache
reset that takes running requests' blocks), and ``IterationStats.num_preempted_reqs`` counts those events in each
batch of outputs (``vllm/v1/metrics/stats.py``); the recorder sums them. vLLM records events only with stats on,
which a custom stat logger turns on (``AsyncLLM.log_stats``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from vllm.config import VllmConfig
from vllm.v1.metrics.loggers import StatLoggerBase, StatLoggerFactory
from vllm.v1.metrics.stats import IterationStats, MultiModalCacheStats, SchedulerStats


@dataclass(slots=True)
class SchedulerLoad:
    """The latest scheduler figures (mutated only by the recorder, on the event loop)."""

    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0
    prefix_queries: int = 0
    prefix_hits: int = 0
    #: Requests vLLM's scheduler preempted since start (KV freed, recomputed when scheduled again).
    preemptions: int = 0

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0


class SchedulerStatsRecorder(StatLoggerBase):
    """A vLLM stat logger that records into a ``SchedulerLoad`` (and logs nothing)."""

    def __init__(self, sink: SchedulerLoad, vllm_config: VllmConfig, engine_index: int = 0) -> None:
        self._sink = sink

    def record(
        self,
        scheduler_stats: SchedulerStats | None,
        iteration_stats: IterationStats | None,
        mm_cache_stats: MultiModalCacheStats | None = None,
        engine_idx: int = 0,
    ) -> None:
        sink = self._sink
        if iteration_stats is not None:  # preemption events come with the outputs of the requests preempted
            sink.preemptions += iteration_stats.num_preempted_reqs
        if scheduler_stats is None:
            return
        sink.running = scheduler_stats.num_running_reqs
        sink.waiting = scheduler_stats.num_waiting_reqs + scheduler_stats.num_skipped_waiting_reqs
        sink.kv_cache_usage = scheduler_stats.kv_cache_usage
        prefix = scheduler_stats.prefix_cache_stats
        if prefix is not None:
            sink.prefix_queries += prefix.queries
            sink.prefix_hits += prefix.hits

    def log_engine_initialized(self) -> None:
        pass


def recorder_factory(sink: SchedulerLoad) -> StatLoggerFactory:
    """What ``AsyncLLM(stat_loggers=[...])`` takes: called with (vllm_config, engine_index)."""
    return functools.partial(SchedulerStatsRecorder, sink)
