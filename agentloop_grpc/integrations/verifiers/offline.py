"""Offline harness programs: verifiers' built-in harnesses (``null``, ``bash``) run their chat program as a uv script
whose packages uv installs on first use, and without uv on PATH verifiers runs ``pip install --user uv`` itself: both
reach the network during a rollout. In the subprocess runtime this module points that program at what ``make setup``
installed instead: the ``uv`` of this venv (the ``verifiers`` extra) and a wheel directory of the program's packages,
with this venv's Python (the wheels are built for it) and no Python downloads.

Variables only, through the harness config's own ``env`` (what verifiers passes to the script's preparation and to
the program): the program, its packages' versions and verifiers' code are unchanged.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import sysconfig
from pathlib import Path

#: Where ``make setup`` downloads the chat program's wheels (beside the venv's own packages).
DEFAULT_WHEELS = Path(sys.prefix) / "verifiers-wheels"


class OfflineHarnessError(ValueError):
    """The harness program would have to reach the network: the sentence says what is missing."""


def uv_directory() -> Path:
    """The directory of the ``uv`` this process can run: this venv's scripts first, then PATH."""
    scripts = Path(sysconfig.get_path("scripts"))
    if (scripts / "uv").is_file():
        return scripts
    found = shutil.which("uv")
    if found is None:
        raise OfflineHarnessError("verifiers' harness programs need uv, which is not installed (pip install "
                                  "'agentloop-grpc[verifiers]' installs it); without it verifiers downloads uv itself")
    return Path(found).parent


def harness_environment(wheels: str | None) -> dict[str, str]:
    """The variables that keep a uv-script harness program offline (``wheels``: the wheel directory; None: the
    default one when it exists, else {} and uv reaches PyPI as verifiers does by itself)."""
    directory = Path(wheels) if wheels is not None else DEFAULT_WHEELS
    if not directory.is_dir():
        if wheels is not None:
            raise OfflineHarnessError(f"harness_wheels: {directory} is not a directory")
        return {}
    return {
        "PATH": f"{uv_directory()}{os.pathsep}{os.environ.get('PATH', '')}",
        # uv reads both: the directory as its only index, so it never asks PyPI (verifiers forces UV_OFFLINE=false)
        "UV_DEFAULT_INDEX": directory.resolve().as_uri(),
        "UV_FIND_LINKS": str(directory.resolve()),
        "UV_PYTHON": sys.executable,
        "UV_PYTHON_DOWNLOADS": "never",
    }


def program_requirements() -> list[str]:
    """The requirements verifiers' chat program (of the null and bash harnesses) declares in its script header."""
    from verifiers.v1.harnesses.utils.launch import CHAT_PROGRAM

    found = re.search(r"^# dependencies = (\[.*\])$", CHAT_PROGRAM, re.MULTILINE)
    if found is None:
        raise RuntimeError("verifiers' chat program declares no dependencies: is this verifiers 0.4?")
    return list(json.loads(found.group(1)))
