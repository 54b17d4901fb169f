"""A rollout (or training run) whose engines come from a discovery file reaches them as the file says: its TLS and
token settings, unless the run's router config has its own."""

from __future__ import annotations

from pathlib import Path

from agentloop_grpc.client_security import ClientSecurity
from agentloop_grpc.launch.launcher import write_discovery
from agentloop_grpc.rollout.config import RolloutConfig
from agentloop_grpc.rollout.run import routing

SECURITY = ClientSecurity(ca_file="/certs/ca.pem", token_file="/certs/token")


def _config(discovery: Path, **router) -> RolloutConfig:
    return RolloutConfig.model_validate({"engines": {"discovery_file": str(discovery)},
                                         "dataset": {"arithmetic": {"count": 1}}, "router": router})


def test_the_discovery_files_security_reaches_the_router(tmp_path: Path) -> None:
    discovery = write_discovery(tmp_path / "discovery.json", [{"address": "10.0.0.2:5000"}], SECURITY)
    config = _config(discovery, placement="sticky_least_loaded")
    assert routing(config).security == SECURITY
    assert routing(config).placement == config.router.placement  # the rest of the run's router config is kept


def test_the_runs_own_security_wins_and_a_plain_file_changes_nothing(tmp_path: Path) -> None:
    mine = ClientSecurity(ca_file="/other/ca.pem")
    protected = write_discovery(tmp_path / "protected.json", [{"address": "10.0.0.2:5000"}], SECURITY)
    assert routing(_config(protected, security=mine.model_dump(exclude_defaults=True))).security == mine
    plain = write_discovery(tmp_path / "plain.json", [{"address": "10.0.0.2:5000"}])
    assert routing(_config(plain)).security is None
