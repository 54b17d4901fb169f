"""The files the package ships besides its code: the agentloop.v1 contracts and the example configs.

A wheel carries them inside the package (setup.py copies them at build time), so users of any language can generate
clients from an installed package:
``protoc -I "$(python -c 'import agentloop_grpc; print(agentloop_grpc.protos_dir())')" ...``.
In a checkout (an editable install) they are the repository's ``protos/`` and ``examples/``.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def protos_dir() -> Path:
    """The folder holding ``agentloop/v1/*.proto`` (the include root to pass to protoc)."""
    return _shipped("protos", "agentloop/v1/engine.proto")


def examples_dir() -> Path:
    """The folder holding the example configs (``demo.yaml``, ``engine.yaml``, ``train.yaml``)."""
    return _shipped("examples", "demo.yaml")


def _shipped(name: str, probe: str) -> Path:
    for folder in (_PACKAGE / name, _PACKAGE.parent / name):  # installed wheel, then checkout
        if (folder / probe).is_file():
            return folder
    raise FileNotFoundError(f"agentloop_grpc ships no {name}/ here ({_PACKAGE}); reinstall the package from a wheel")
