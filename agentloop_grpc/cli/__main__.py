"""``python -m agentloop_grpc.cli``: the ``agentloop`` command."""

from agentloop_grpc.cli import main

main()
