"""The embedded default engine: transformers on CPU with our own continuous-batching scheduler.

See NOTES.md beside this file for the design, what is measured and what is left.
"""

from .config import EmbeddedEngineConfig
from .engine import EmbeddedEngine

__all__ = ["EmbeddedEngine", "EmbeddedEngineConfig"]
