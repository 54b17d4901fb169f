"""The ``agentloop`` command line: ``main`` runs it (the ``agentloop`` script and ``python -m agentloop_grpc.cli``).

``commands`` holds the command group and the engine, tools and model commands (``agentloop rollout`` and
``agentloop train`` live in ``rollout.command`` and ``train.command``); ``usage_errors``
(and ``common/config_errors.py``, shared with the commands it adds) print a bad command line or config as
``error: ...`` lines.
"""

from __future__ import annotations

import os


def main() -> None:
    """Run the ``agentloop`` command group on ``sys.argv``."""
    # Before torch loads (libgomp reads it once, at load): its default spin-waiting makes engine processes on one
    # node stall each other, and this bound keeps a lone engine as fast and a contended one usable (figures in
    # agentloop_grpc/engine_adapters/embedded/NOTES.md); set here, not at import, so importing the CLI's modules
    # changes no one's environment.
    os.environ.setdefault("GOMP_SPINCOUNT", "10000")
    from .commands import app

    app()
