"""Prometheus metrics of one gateway, in a registry of its own (several gateways may live in one process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter("agentloop_gateway_requests", "Requests answered, by API and HTTP status",
                                ["api", "status"], registry=r)
        self.latency = Histogram("agentloop_gateway_request_seconds", "Model-turn request durations, by API",
                                 ["api"], buckets=_BUCKETS, registry=r)
        self.forks = Counter("agentloop_gateway_forks", "Chains forked because a history did not append", registry=r)
        self.turns = Counter("agentloop_gateway_turns", "Model turns recorded", registry=r)
        self.sessions = Gauge("agentloop_gateway_sessions", "Live sessions", registry=r)
        self.expired = Gauge("agentloop_gateway_sessions_expired", "Sessions dropped by the TTL so far", registry=r)
        self.ignored = Counter("agentloop_gateway_ignored_fields", "Requests holding a field the gateway accepted "
                               "and ignored (or a hosted tool it left out), by field name", ["field"], registry=r)
        self.infrastructure_failures = Counter(
            "agentloop_gateway_infrastructure_failures", "Turns the engines failed (never trained on)", registry=r)
