"""A slow, stalling or flapping link between the rollout driver (node0) and one engine server (node1), through a
delay proxy in node0 (this kernel has no netem): below the Router's bounds nothing fails over; a stall beyond them is
detected and the generations resume on the other server, token-exact. The shared cluster of conftest.py."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .harness import Cluster, skip_reason
from .processes import ENGINE, ROOT, Engines, announced

pytestmark = [pytest.mark.cluster, pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))]

#: Added latency each way: a 1.2 s round trip, longer than a GetLoad poll's timeout was (1 s: every poll timed out,
#: and the server was taken out as hung at the liveness bound).
DELAY_S = 0.6
#: Short stalls: well below the channel's ping timeout less the round trip (5 - 1.2 s), the shortest stall a Router
#: can notice, with a margin for a loaded machine's scheduling.
STALL_S = 2.0
FLAP_DOWN_S, FLAP_UP_S, FLAPS = 1.0, 0.5, 3
SESSIONS = 8
#: Generations that outlast the faults below the bound (10 ms a token: 10 s) and a shorter one for the stall.
SLOW_TOKENS, STALL_TOKENS = 1000, 300


class _Proxy:
    """The delay proxy in a node, driven over its stdin."""

    def __init__(self, cluster: Cluster, upstream: str, log: Path) -> None:
        self.log = log
        self.process = cluster.head.spawn(
            [sys.executable, "-m", "tests.cluster.delay_proxy", cluster.head.address, upstream],
            log=log, env={"PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stdin=subprocess.PIPE,
        )
        self.address = announced(self.process, r"listening on (\S+)", 30, log).group(1)

    def tell(self, command: str) -> float:
        """Apply ``command``; the unix time it took effect."""
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return float(announced(self.process, r"^ok (\S+)", 10, self.log).group(1))

    def stats(self) -> dict[str, int]:
        self.process.stdin.write("stats\n")
        self.process.stdin.flush()
        return json.loads(announced(self.process, r"^(\{.*\})$", 10, self.log).group(1))

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.mark.fault
def test_a_slow_or_flapping_link_fails_nothing_over_below_the_bound_and_a_longer_stall_resumes_elsewhere(
    cluster: Cluster, engines: Engines, cluster_timings: dict[str, float], tmp_path: Path
) -> None:
    """Eight generations over both engine servers, node1's through the proxy: 600 ms each way, a 2 s stall and three
    1 s flaps leave every one on its server, complete and token-exact, over one connection that never dropped; then
    a stall for good: the Router takes the proxied server out within its liveness bound and its generations resume
    on node2 from the tokens received, token-exact; once the stall ends, the server is routed to again."""
    upstream = engines.servers[0]["address"]
    other = engines.servers[1]["address"]
    proxy = _Proxy(cluster, upstream, tmp_path / "proxy.log")
    log = tmp_path / "driver.log"
    driver = None
    try:
        proxy.tell(f"delay {DELAY_S}")
        driver = cluster.head.spawn(
            [sys.executable, "-m", "tests.cluster.slow_link_driver", str(engines.discovery), proxy.address, upstream,
             str(SESSIONS), str(SLOW_TOKENS), str(STALL_TOKENS), str(ENGINE["vocab_size"])],
            log=log, env={"PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stdin=subprocess.PIPE,
        )

        def tell(word: str, at: float) -> None:
            driver.stdin.write(f"{word} {at}\n")
            driver.stdin.flush()

        # 1. below the bound: the latency throughout, a stall, then flaps, while the generations run
        placed = json.loads(announced(driver, r"^streaming (.*)", 60, log).group(1))
        assert set(placed.values()) == {proxy.address, other}  # both servers have work
        time.sleep(0.5)
        proxy.tell(f"stall {STALL_S}")
        time.sleep(STALL_S + 0.5)
        proxy.tell(f"flap {FLAP_DOWN_S} {FLAP_UP_S} {FLAPS}")
        time.sleep(FLAPS * (FLAP_DOWN_S + FLAP_UP_S))
        tell("slowed", time.time())
        # 2. beyond it: a stall for good
        placed_again = json.loads(announced(driver, r"^streaming (.*)", 60, log).group(1))
        assert set(placed_again.values()) == {proxy.address, other}
        connections = proxy.stats()["accepted"]
        tell("stalled", proxy.tell("stall 600"))
        announced(driver, r"^finished", 60, log)
        tell("released", proxy.tell("release"))
        done = json.loads(announced(driver, r"^done (.*)", 60, log).group(1))
        assert driver.wait(30) == 0
    finally:
        if driver is not None and driver.poll() is None:
            driver.kill()
            driver.wait()
        proxy.stop()

    below, beyond = done["below"], done["beyond"]
    # below the bound: no failover, nothing lost, the proxied server never taken out, its connection kept
    assert below["health_changes"] == []
    assert connections == 1  # the Router's one connection to it, never dropped
    assert below["tokens"] == dict.fromkeys(placed, SLOW_TOKENS)
    assert below["servers"] == {s: [server] for s, server in placed.items()}
    assert below["failovers"] == dict.fromkeys(placed, 0)
    assert below["cut_at"] == dict.fromkeys(placed, SLOW_TOKENS)  # each the engine's one stream, token for token
    slowed = [s for s, server in placed.items() if server == proxy.address]
    assert all(below["longest_gap_s"][s] >= STALL_S - 0.5 for s in slowed)  # the stall did hold their streams
    cluster_timings["slow link: longest stream gap ridden out"] = max(below["longest_gap_s"][s] for s in slowed)
    # beyond it: the stalled server's generations resumed on the other one, the rest undisturbed
    cut = {s for s, server in placed_again.items() if server == proxy.address}
    assert beyond["tokens"] == dict.fromkeys(placed_again, STALL_TOKENS)
    assert {s: tuple(v) for s, v in beyond["servers"].items()} == {
        s: (proxy.address, other) if s in cut else (other,) for s in placed_again
    }
    assert all(0 < beyond["cut_at"][s] < STALL_TOKENS for s in cut)
    assert all(beyond["cut_at"][s] == STALL_TOKENS for s in placed_again.keys() - cut)
    detected, resumed = beyond["detected_s"], max(beyond["resumed_s"].values())
    cluster_timings["stall: server taken out after"] = detected
    cluster_timings["stall: last generation resumed after"] = resumed
    cluster_timings["stall ended: server routed to again after"] = done["routed_to_again_s"]
    # not before a ping sent a round trip before the stall could time out (5 s after it was sent), within the
    # liveness bound (RouterConfig.liveness_timeout_s, 10 s)
    assert detected is not None and 5 - 2 * DELAY_S - 0.5 <= detected <= 10 + 1.5
