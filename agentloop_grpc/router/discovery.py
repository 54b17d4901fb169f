"""A launcher's discovery file, read: ``{"servers": [{"address": "host:port", ...}, ...], "security": {...}}``."""

from __future__ import annotations

import json
from pathlib import Path

from agentloop_grpc.client_security import ClientSecurity

from .config import RouterConfig


def discovery_addresses(path: str | Path) -> list[str]:
    """The addresses in a launcher's discovery file."""
    document = json.loads(Path(path).read_text())
    return [entry["address"] for entry in document["servers"]]


def discovery_security(path: str | Path) -> ClientSecurity | None:
    """How to reach a discovery file's servers (its optional ``security``: paths and variable names only)."""
    document = json.loads(Path(path).read_text())
    return ClientSecurity.model_validate(document["security"]) if document.get("security") else None


def discovery_config(path: str | Path, config: RouterConfig | None) -> RouterConfig:
    """``config`` (default: RouterConfig()), with the discovery file's security unless it has its own."""
    config = config or RouterConfig()
    security = discovery_security(path)
    if config.security is None and security is not None:
        config = config.model_copy(update={"security": security})
    return config
