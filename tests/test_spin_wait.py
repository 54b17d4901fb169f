"""torch's OpenMP threads are bounded in how long they spin-wait in every test process (tests/conftest.py): libgomp
reads GOMP_SPINCOUNT once, when torch loads, so the bound must be set before the first test module that imports
torch is collected, not in the conftest of the folder that needs it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent

# Reports, as soon as a collected module has imported torch, whether GOMP_SPINCOUNT was already set.
_PROBE = textwrap.dedent("""
    import os, sys, pytest

    class Probe:
        said = False

        def pytest_collectreport(self, report):
            if not Probe.said and "torch" in sys.modules:
                Probe.said = True
                print("SPINCOUNT_AT_TORCH", os.environ.get("GOMP_SPINCOUNT"), flush=True)

    pytest.main(["--collect-only", "-q", "-p", "no:randomly", "-p", "no:cacheprovider", *sys.argv[1:]],
                plugins=[Probe()])
""")


def test_the_spin_bound_is_set_before_collection_loads_torch() -> None:
    env = {name: value for name, value in os.environ.items() if name != "GOMP_SPINCOUNT"}
    # the first module of the suite that imports torch (tests/agent, collected long before tests/embedded)
    modules = ["tests/agent/test_records.py"]
    probe = subprocess.run([sys.executable, "-c", _PROBE, *modules], cwd=_ROOT, env=env, capture_output=True,
                           text=True, timeout=120)
    lines = [line for line in probe.stdout.splitlines() if line.startswith("SPINCOUNT_AT_TORCH")]
    assert lines, probe.stdout[-2000:] + probe.stderr[-2000:]
    assert lines[0] == "SPINCOUNT_AT_TORCH 10000"
