"""The metrics every generate counts in plain numbers (metrics.py) read out as prometheus_client's own counter and
histogram would: same sample names, labels, buckets (a value on a bound falls in that bound's bucket) and sums."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from agentloop_grpc.router.metrics import LoopCounter, LoopHistogram

BOUNDS = (0.001, 0.01, 1.0)


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in registry.collect()
        for sample in family.samples
        if not sample.name.endswith("_created")  # when prometheus_client's came to be: ours keep no such time
    }


def test_a_loop_histogram_reads_as_prometheus_clients() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    loop = LoopHistogram("h_seconds", "doc", BOUNDS, ours)
    histogram = Histogram("h_seconds", "doc", buckets=BOUNDS, registry=theirs)
    for value in (0.0, 0.0005, 0.001, 0.0010001, 0.5, 1.0, 7.0, 300.0):  # on bounds, between, beyond the last
        loop.observe(value)
        histogram.observe(value)
    assert _samples(ours) == _samples(theirs)
    assert _samples(ours)[("h_seconds_bucket", (("le", "0.001"),))] == 3


def test_a_loop_counter_reads_as_prometheus_clients() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    loop = LoopCounter("decisions", "doc", "decision", ("new", "sticky"), ours)
    counter = Counter("decisions", "doc", ["decision"], registry=theirs)
    counter.labels("new")  # a label value is shown from the start, at 0
    for value in ("sticky", "sticky", "sticky"):
        loop.counts[value] += 1
        counter.labels(value).inc()
    assert _samples(ours) == _samples(theirs)
