"""agentloop-grpc: the gRPC, engine-agnostic rollout layer for agentic RL.

The contracts live in ``protos/agentloop/v1``; their generated Python stubs in ``agentloop_grpc.v1``; engine
servers in ``agentloop_grpc.engine_adapters``.
"""

__version__ = "0.1.0"
