"""Router metrics in a Prometheus registry owned by the Fleet, shared by its Router (never the global default
registry).

The caller serves it however it likes, e.g.
``prometheus_client.start_http_server(port, registry=router.metrics.registry)``.

What every generate call counts (its routing decision, its attempt, its latencies) is counted in plain numbers by
the Router's event loop and read when the registry is collected: prometheus_client takes a lock for each count and
each histogram bucket, several per call for values read once per scrape at most (figures in NOTES.md).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class LoopCounter(Collector):
    """A counter with one label, counted by one event loop: ``counts[label] += 1``; exposed as a Counter is."""

    def __init__(self, name: str, documentation: str, label: str, values: Iterable[str],
                 registry: CollectorRegistry) -> None:
        self._name, self._documentation, self._label = name, documentation, label
        self.counts = dict.fromkeys(values, 0)
        registry.register(self)

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self._name, self._documentation, labels=[self._label])
        for value, count in list(self.counts.items()):
            family.add_metric([value], count)
        yield family


class LoopHistogram(Collector):
    """A histogram observed by one event loop (``observe``), exposed as a prometheus Histogram is."""

    def __init__(self, name: str, documentation: str, bounds: tuple[float, ...], registry: CollectorRegistry) -> None:
        self._name, self._documentation, self._bounds = name, documentation, bounds
        self._counts = [0] * (len(bounds) + 1)  # the last: above every bound
        self._sum = 0.0
        registry.register(self)

    def observe(self, value: float) -> None:
        self._counts[bisect.bisect_left(self._bounds, value)] += 1  # bucket i: value <= bounds[i]
        self._sum += value

    def collect(self) -> Iterator[Metric]:
        counts, total, cumulative, buckets = list(self._counts), self._sum, 0, []
        for bound, count in zip((*self._bounds, float("inf")), counts, strict=True):
            cumulative += count
            buckets.append((floatToGoString(bound), cumulative))
        yield HistogramMetricFamily(self._name, self._documentation, buckets=buckets, sum_value=total)


class RouterMetrics:
    """Per-server in-flight, load and health; routing decisions; failovers and retries; latencies."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.in_flight = Gauge(
            "agentloop_router_in_flight", "Requests this router has in flight", ["server"], registry=r
        )
        self.server_load = Gauge(
            "agentloop_router_server_load", "Running + waiting requests the server reported", ["server"], registry=r
        )
        self.server_healthy = Gauge(
            "agentloop_router_server_healthy", "1 while the server reports SERVING", ["server"], registry=r
        )
        self.server_weight_version = Gauge(
            "agentloop_router_server_weight_version", "Weight version the server last reported", ["server"], registry=r
        )
        self.expected_weight_version = Gauge(
            "agentloop_router_expected_weight_version",
            "The fleet's weight version: the highest pushed or reported; servers below it are held out",
            registry=r,
        )
        self.server_behind = Gauge(
            "agentloop_router_server_behind",
            "1 while the server is held out of routing for serving an older weight version than the fleet's",
            ["server"],
            registry=r,
        )
        self.servers_lost = Counter(
            "agentloop_router_servers_lost",
            "Times a server was taken out of routing for answering no GetLoad within liveness_timeout_s (its "
            "generations failed over)",
            ["server"],
            registry=r,
        )
        self.decisions = LoopCounter(
            "agentloop_router_routing_decisions",
            "Routing decisions: new (first request of a session), sticky (same server), moved (rebalanced or "
            "failed over)",
            "decision", ("new", "sticky", "moved"), r,
        )
        self.failovers = Counter(
            "agentloop_router_failovers", "Generate calls resumed on another server after tokens", registry=r
        )
        self.resumes = Counter(
            "agentloop_router_resumes", "Generations aborted (a weight update's Pause) and resumed with their tokens",
            registry=r,
        )
        self.retries = Counter(
            "agentloop_router_retries", "Generate attempts retried, by status code", ["code"], registry=r
        )
        self.attempts = LoopCounter(
            "agentloop_router_generate_attempts",
            "Generate attempts sent, by RPC: stream (Generate) or unary (GenerateUnary, generate() calls whose "
            "budget fits one message)",
            "rpc", ("stream", "unary"), r,
        )
        self.generate_seconds = LoopHistogram(
            "agentloop_router_generate_seconds", "Whole generate calls", _LATENCY_BUCKETS, r
        )
        self.first_token_seconds = LoopHistogram(
            "agentloop_router_first_token_seconds", "Time to the first token", _LATENCY_BUCKETS, r
        )

    def value(self, name: str, **labels: str) -> float:
        """Current value of a sample (0 when absent): convenient for reports and tests."""
        return self.registry.get_sample_value(name, labels) or 0.0
