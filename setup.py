"""Build hook: generate the agentloop.v1 Python stubs before the package's modules are collected.

Everything else about the package lives in pyproject.toml.
"""

import runpy
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


class BuildPyWithProtos(build_py):
    """build_py that first runs protos/generate_python.py into the source tree's agentloop_grpc/v1."""

    def run(self) -> None:
        generator = runpy.run_path(str(HERE / "protos" / "generate_python.py"))
        generator["generate_python"](HERE / "agentloop_grpc" / "v1")
        super().run()


setup(cmdclass={"build_py": BuildPyWithProtos})
