"""agentloop-grpc: the gRPC, engine-agnostic rollout layer for agentic RL.

The contracts live in ``protos/agentloop/v1`` (shipped in the wheel: ``protos_dir()``); their generated Python stubs
in ``agentloop_grpc.v1``; engine servers in ``agentloop_grpc.engine_adapters``.
"""

from agentloop_grpc.package_files import examples_dir, protos_dir

# pyproject.toml reads the package version from here
__version__ = "0.1.0"

__all__ = ["__version__", "examples_dir", "protos_dir"]
