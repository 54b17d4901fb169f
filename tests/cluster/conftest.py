"""What the cluster suites share: the timings their fixtures record, printed at the end of the run (how long a
cluster takes to come up and to go, what a fault took to detect)."""

from __future__ import annotations

import pytest

_TIMINGS = pytest.StashKey[dict[str, float]]()


@pytest.fixture(scope="session")
def cluster_timings(pytestconfig: pytest.Config) -> dict[str, float]:
    """Seconds by name; the terminal summary lists them."""
    return pytestconfig.stash.setdefault(_TIMINGS, {})


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    timings = config.stash.get(_TIMINGS, {})
    if timings:
        terminalreporter.write_sep("-", "cluster timings (s)")
        for name, seconds in timings.items():
            terminalreporter.write_line(f"{name}: {seconds:.2f}")
