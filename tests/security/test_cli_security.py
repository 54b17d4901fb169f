"""The command line: a server bound beyond loopback without a token says what it exposes; `engine launch` with
TLS and tokens starts protected servers and writes a discovery file that names where the secrets are (never the
secrets) and that a Router reaches them with."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from agentloop_grpc.common.types import SamplingParams
from agentloop_grpc.router import GenerateCall, Router

from .conftest import ADMIN_TOKEN, TOKEN, Pki

pytestmark = pytest.mark.fault

AGENTLOOP = [sys.executable, "-m", "agentloop_grpc.cli"]


def first_lines(args: list[str], env: dict[str, str] | None = None) -> tuple[str, str]:
    """Start a server, read its listening line, stop it; return (stdout line, stderr)."""
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = process.stdout.readline()
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    return line, err


@pytest.mark.parametrize("command", [["engine", "serve", "--adapter", "fake"], ["tools", "serve", "--config",
                                                                               "agentloop_grpc/tools/builtin.yaml"]])
def test_binding_every_interface_without_a_token_warns_what_is_exposed(command: list[str], pki: Pki) -> None:
    line, err = first_lines([*AGENTLOOP, *command, "--host", "0.0.0.0", "--port", "0"])
    assert "listening on 0.0.0.0:" in line
    assert "WITHOUT AUTHENTICATION" in err
    assert ("UpdateWeights" in err) if command[0] == "engine" else ("python sandbox" in err)
    line, err = first_lines([*AGENTLOOP, *command, "--host", "0.0.0.0", "--port", "0", "--auth-token-file",
                             str(pki.token), "--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key)])
    assert "listening on" in line and "WITHOUT AUTHENTICATION" not in err and "plaintext" not in err
    line, err = first_lines([*AGENTLOOP, *command, "--host", "127.0.0.1", "--port", "0"])
    assert "listening on" in line and "WARNING" not in err
    # client certificates authenticate callers too
    line, err = first_lines([*AGENTLOOP, *command, "--host", "0.0.0.0", "--port", "0",
                             "--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key),
                             "--tls-client-ca", str(pki.ca)])
    assert "listening on" in line and "WARNING" not in err


def test_unreadable_token_or_half_tls_pair_is_a_clear_error(tmp_path) -> None:
    missing = subprocess.run([*AGENTLOOP, "engine", "serve", "--adapter", "fake", "--port", "0",
                              "--auth-token-file", str(tmp_path / "nope")], capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "nope" in missing.stderr
    half = subprocess.run([*AGENTLOOP, "engine", "serve", "--adapter", "fake", "--port", "0", "--tls-cert", "x.pem"],
                          capture_output=True, text=True, timeout=60)
    assert half.returncode == 2 and "--tls-key" in half.stderr


@pytest.mark.slow
async def test_launch_with_tls_and_tokens_writes_a_discovery_file_without_secrets(tmp_path, pki: Pki) -> None:
    discovery = tmp_path / "discovery.json"
    env = {**os.environ, "AGENTLOOP_TEST_ADMIN": ADMIN_TOKEN}
    launcher = subprocess.Popen(
        [*AGENTLOOP, "engine", "launch", "--adapter", "fake", "--dp", "2", "--discovery-file", str(discovery),
         "--log-dir", str(tmp_path / "logs"), "--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key),
         "--tls-ca", str(pki.ca), "--auth-token-file", str(pki.token), "--admin-token-env", "AGENTLOOP_TEST_ADMIN"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        line = launcher.stdout.readline()
        assert "2 fake server(s) serving" in line, launcher.stderr.read() if launcher.poll() is not None else line
        text = discovery.read_text()
        assert TOKEN not in text and ADMIN_TOKEN not in text
        security = json.loads(text)["security"]
        assert security == {"tls": True, "ca_file": str(pki.ca), "token_file": str(pki.token),
                            "admin_token_env": "AGENTLOOP_TEST_ADMIN"}
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("AGENTLOOP_TEST_ADMIN", ADMIN_TOKEN)
            async with Router.from_discovery_file(discovery) as router:
                await router.fleet.wait_ready(min_servers=2, timeout_s=30)
                result = await router.generate(GenerateCall("s", [1, 2, 3], SamplingParams(max_new_tokens=2)))
                assert len(result.token_ids) == 2
                assert (await router.fleet.flush_cache()).ok  # a control call: the admin token from the variable
    finally:
        launcher.send_signal(signal.SIGTERM)
        launcher.communicate(timeout=60)
    assert launcher.returncode == 0
