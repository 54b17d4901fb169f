"""The embedded default engine: transformers on CPU (or one GPU) with our own continuous-batching scheduler.

See NOTES.md beside this file for the design, what is measured and what is left. ``EmbeddedEngine`` (torch) is
imported on first use, so reading an ``EmbeddedEngineConfig`` does not load torch.
"""

from .config import EmbeddedEngineConfig


def __getattr__(name: str) -> object:
    if name == "EmbeddedEngine":  # on first use: importing torch takes seconds
        from .engine import EmbeddedEngine

        return EmbeddedEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = ["EmbeddedEngine", "EmbeddedEngineConfig"]
