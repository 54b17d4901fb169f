"""The vLLM engine adapter: vLLM's ``AsyncLLM`` in the server process, its EngineCore in its own process (ZMQ).

``VllmEngine`` imports vLLM (seconds, and it must be installed: ``pip install agentloop-grpc[vllm]`` or
``make setup``), so it is imported on first use; ``VllmEngineConfig`` is importable without vLLM.
"""

from .config import VllmEngineConfig


def __getattr__(name: str) -> object:
    if name == "VllmEngine":  # on first use: importing vLLM takes seconds
        from .engine import VllmEngine

        return VllmEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = ["VllmEngine", "VllmEngineConfig"]
