"""The vLLM engine adapter: vLLM's ``AsyncLLM`` in the server process, its EngineCore in its own process (ZMQ).

Importing this package imports vLLM (seconds, and it must be installed: ``pip install agentloop-grpc[vllm]``
or ``make setup``); the CLI and the contract suite import it only when the vLLM adapter is asked for.
"""

from .config import VllmEngineConfig
from .engine import VllmEngine

__all__ = ["VllmEngine", "VllmEngineConfig"]
