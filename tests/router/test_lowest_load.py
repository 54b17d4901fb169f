"""The lowest load the Fleet keeps as loads change (lowest_load.py), so that a sticky call is judged in O(1): it is
always the min() over the counted servers' loads, and the sticky/imbalance decision made with it is the decision
made with that min() (policy.keeps), as pure functions."""

from __future__ import annotations

import itertools
import random

from agentloop_grpc.router import RouterConfig
from agentloop_grpc.router.lowest_load import LowestLoad
from agentloop_grpc.router.policy import Decision, choose_server, keeps

CONFIG = RouterConfig(imbalance_ratio=2.0, imbalance_min_gap=4)


def test_the_lowest_is_the_min_over_servers_through_begins_ends_reports_and_health() -> None:
    rng = random.Random(37)
    counted: dict[str, int] = {}
    lowest, out = LowestLoad(), {f"s{i}": 0 for i in range(32)}
    assert lowest.value is None
    for _ in range(20_000):
        server = rng.choice(sorted(counted.keys() | out.keys()))
        op = rng.random()
        if server in out:
            if op < 0.3:  # it becomes healthy, carrying what it carried
                counted[server] = out.pop(server)
                lowest.add(counted[server])
            else:  # not counted: its load changes unseen
                out[server] = max(0, out[server] + rng.choice((-1, 1)))
        elif op < 0.02:  # it stops serving
            out[server] = counted.pop(server)
            lowest.remove(out[server])
        else:  # a request begins or ends (by one), or a report jumps
            old = counted[server]
            new = max(0, old + rng.choice((-1, 1))) if op < 0.9 else rng.randrange(40)
            if new != old:
                lowest.move(old, new)
                counted[server] = new
        assert lowest.value == (min(counted.values()) if counted else None)


def test_the_sticky_decision_with_the_kept_lowest_is_the_one_over_every_load() -> None:
    lowest, loads = LowestLoad(), {"a": 0, "b": 0, "c": 0}
    for load in loads.values():
        lowest.add(load)
    for a, b, c in itertools.product(range(0, 24, 3), range(0, 24, 5), range(0, 24, 7)):
        for address, load in {"a": a, "b": b, "c": c}.items():  # reached one server's change at a time
            if load != loads[address]:
                lowest.move(loads[address], load)
                loads[address] = load
        for current in ("a", "b", "c"):
            stays = choose_server("s", current, loads, CONFIG)[1] is Decision.STICKY
            assert keeps(loads[current], lowest.value, CONFIG) is stays, (loads, current)
