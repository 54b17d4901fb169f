"""Prometheus metrics of one server (engine or tools): every RPC counted by method and status code, its latency,
the calls in flight, refused authentications, and what an engine reports of itself (queue, KV-cache usage, prefix
cache hit rate, weight version, state).

``ServerMetrics`` owns a registry (never the global default one, so several servers can live in one process);
``MetricsInterceptor`` fills it; ``serve_metrics`` exposes it over HTTP (``--metrics-port``) together with the
process's default registry, where vLLM registers its own metrics, so the vllm adapter keeps them.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any
from wsgiref.simple_server import WSGIServer

import grpc
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from .handlers import behavior_of, with_behavior

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class ServerMetrics:
    """The registry of one server and the metrics every server has."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter("agentloop_server_requests", "RPCs answered, by method and status code",
                                ["method", "code"], registry=r)
        self.latency = Histogram("agentloop_server_request_seconds", "RPC durations (whole streams), by method",
                                 ["method"], buckets=_LATENCY_BUCKETS, registry=r)
        self.in_flight = Gauge("agentloop_server_in_flight", "RPCs being answered, by method", ["method"], registry=r)
        self.auth_failures = Counter("agentloop_server_auth_failures", "Calls refused for their credentials, by code",
                                     ["code"], registry=r)

    def value(self, name: str, **labels: str) -> float:
        """Current value of a sample (0 when absent): convenient for tests."""
        return self.registry.get_sample_value(name, labels) or 0.0


class MetricsInterceptor(grpc.aio.ServerInterceptor):
    """Counts, times and tracks in flight every RPC (health included: it is what load balancers call)."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self._metrics = metrics

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method.rsplit("/", 1)[-1]
        metrics = self._metrics
        requests = metrics.requests
        latency, in_flight = metrics.latency.labels(method), metrics.in_flight.labels(method)

        def finished(context: grpc.aio.ServicerContext, started: float, error: BaseException | None) -> None:
            in_flight.dec()
            latency.observe(time.perf_counter() - started)
            code = context.code()
            if code is None:  # not set by the handler: OK, or the error the exception turns into
                code = grpc.StatusCode.CANCELLED if isinstance(error, _CANCELLED) else \
                    grpc.StatusCode.UNKNOWN if error is not None else grpc.StatusCode.OK
            requests.labels(method, code.name if isinstance(code, grpc.StatusCode) else str(code)).inc()

        behavior = behavior_of(handler)
        if inspect.isasyncgenfunction(behavior):
            async def observed_stream(request: object, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                in_flight.inc()
                started, error = time.perf_counter(), None
                try:
                    async for response in behavior(request, context):
                        yield response
                except BaseException as exc:
                    error = exc
                    raise
                finally:
                    finished(context, started, error)

            return with_behavior(handler, observed_stream)

        async def observed(request: object, context: grpc.aio.ServicerContext) -> Any:
            in_flight.inc()
            started, error = time.perf_counter(), None
            try:
                return await behavior(request, context)
            except BaseException as exc:
                error = exc
                raise
            finally:
                finished(context, started, error)

        return with_behavior(handler, observed)


_CANCELLED = (GeneratorExit, asyncio.CancelledError)


#: One gauge sample: name, help, labels, value.
GaugeSample = tuple[str, str, dict[str, str], float]


class GaugesCollector(Collector):
    """Gauges read from ``read()`` when scraped (an engine's load and state)."""

    def __init__(self, read: Callable[[], list[GaugeSample]]) -> None:
        self._read = read

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families: dict[str, GaugeMetricFamily] = {}
        for name, description, labels, value in self._read():
            if name not in families:
                families[name] = GaugeMetricFamily(name, description, labels=list(labels))
            families[name].add_metric(list(labels.values()), value)
        yield from families.values()


class _Combined(Collector):
    """Several registries served as one."""

    def __init__(self, *registries: CollectorRegistry) -> None:
        self._registries = registries

    def collect(self) -> Iterator[Any]:
        for registry in self._registries:
            yield from registry.collect()


def serve_metrics(registry: CollectorRegistry, host: str, port: int) -> WSGIServer:
    """Serve ``registry`` and the process's default registry at ``http://host:port/metrics`` from a daemon
    thread; return the HTTP server (``server_port``: the chosen port for 0; ``shutdown()`` stops it)."""
    combined = CollectorRegistry(auto_describe=False)
    combined.register(_Combined(registry, REGISTRY))
    server, _thread = start_http_server(port, addr=host, registry=combined)
    return server


def expose(metrics: ServerMetrics, address: str, port: int, on_port: Callable[[int], None] | None = None) -> None:
    """Serve a server's ``metrics`` on the host it listens on (``address``), at ``port``; tell ``on_port`` the port."""
    http = serve_metrics(metrics.registry, address.rsplit(":", 1)[0].strip("[]"), port)
    if on_port is not None:
        on_port(http.server_port)
