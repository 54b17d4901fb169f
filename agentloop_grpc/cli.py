"""The ``agentloop`` command line.

``agentloop engine serve --adapter fake --port 50051`` runs one engine server (one data-parallel group). With
``--port 0`` the chosen port is printed on the first line of standard output:
``agentloop engine listening on 127.0.0.1:PORT``.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import sys

import typer

from agentloop_grpc.engine_adapters.fake import FakeEngine, FakeEngineConfig
from agentloop_grpc.engine_adapters.server import PortInUseError, serve

app = typer.Typer(help="agentloop-grpc: gRPC rollout layer for agentic RL.", no_args_is_help=True)
engine_app = typer.Typer(help="Engine servers (one per data-parallel group).", no_args_is_help=True)
app.add_typer(engine_app, name="engine")


class AdapterKind(str, enum.Enum):
    """Engines that can be served."""

    FAKE = "fake"


@engine_app.command("serve")
def engine_serve(
    adapter: AdapterKind = typer.Option(AdapterKind.FAKE, help="Which engine to serve."),
    host: str = typer.Option("127.0.0.1", help="Address to bind (0.0.0.0 to accept other machines)."),
    port: int = typer.Option(50051, min=0, max=65535, help="Port to bind; 0 picks a free one and prints it."),
    dp_rank: int = typer.Option(0, min=0, help="This server's data-parallel rank."),
    dp_size: int = typer.Option(1, min=1, help="Number of data-parallel groups."),
    drain_timeout: float = typer.Option(30.0, min=0, help="Seconds in-flight requests get to finish on SIGTERM."),
    fake_token_latency_ms: float = typer.Option(0.0, min=0, help="Fake engine: milliseconds per decode step."),
    fake_prefill_us_per_token: float = typer.Option(
        0.0, min=0, help="Fake engine: microseconds of prefill per uncached prompt token."
    ),
    fake_max_running: int = typer.Option(64, min=1, help="Fake engine: batch capacity."),
    fake_max_waiting: int = typer.Option(4096, min=0, help="Fake engine: waiting-queue bound."),
    fake_vocab_size: int = typer.Option(32000, min=3, help="Fake engine: vocabulary size."),
    fake_max_model_len: int = typer.Option(4096, min=2, help="Fake engine: max prompt + generated tokens."),
    log_level: str = typer.Option("INFO", help="Python logging level."),
) -> None:
    """Serve one engine over agentloop.v1 (TokenGenerate, EngineControl, health, reflection)."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if dp_rank >= dp_size:
        raise typer.BadParameter(f"--dp-rank {dp_rank} must be below --dp-size {dp_size}")
    engine = FakeEngine(
        FakeEngineConfig(
            vocab_size=fake_vocab_size,
            max_model_len=fake_max_model_len,
            token_latency_s=fake_token_latency_ms / 1000,
            prefill_latency_s_per_token=fake_prefill_us_per_token / 1e6,
            max_running=fake_max_running,
            max_waiting=fake_max_waiting,
            dp_rank=dp_rank,
            dp_size=dp_size,
        )
    )

    def announce(bound_port: int) -> None:
        print(f"agentloop engine listening on {host}:{bound_port} (adapter {adapter.value})", flush=True)

    try:
        asyncio.run(serve(engine, f"{host}:{port}", drain_timeout, on_listening=announce))
    except PortInUseError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
