"""Engine adapters: one engine behind one agentloop.v1 gRPC server per data-parallel group.

``protocol.EngineAdapter`` is what an engine implements,
``servicer.EngineServicer`` serves any adapter, ``server`` runs it; ``fake.FakeEngine`` is the fake engine for
contract tests and overhead benchmarks. Each adapter has one pydantic config keyed on ``kind``
(``config.EngineConfig``, their union), and ``factory.make_adapter(kind, config)`` builds any of them.
"""
