"""What a script prints in fresh interpreters with different hash seeds: for results that must not depend on the
process (str and bytes hashes are seeded per process; tests compare fake-engine streams across servers)."""

from __future__ import annotations

import os
import subprocess
import sys


def outputs_under_hash_seeds(script: str, seeds: tuple[str, ...] = ("1", "2")) -> set[str]:
    """The distinct stdouts of ``python -c script`` run once per PYTHONHASHSEED in ``seeds``."""
    return {
        subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout.strip()
        for seed in seeds
    }
