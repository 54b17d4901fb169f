"""Build hook: generate the agentloop.v1 Python stubs and ship the contracts and example configs in the package.

A wheel build writes everything into the build directory, so ``pip wheel .`` and ``python -m build`` leave the
checkout as they found it; an editable install (``pip install -e .``) generates the stubs into the checkout's
``agentloop_grpc/v1``, where its imports look (gitignored, as with ``make protos``). Everything else about the
package lives in pyproject.toml.
"""

import runpy
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
PROTOS = HERE / "protos"
EXAMPLES = HERE / "examples"


class BuildPyWithProtos(build_py):
    """build_py that also generates the stubs and copies protos/ and examples/ into the built package."""

    def run(self) -> None:
        generate_python = runpy.run_path(str(PROTOS / "generate_python.py"))["generate_python"]
        if self.editable_mode:
            # the editable package is the checkout itself: protos_dir() and examples_dir() find the repo's folders
            generate_python(HERE / "agentloop_grpc" / "v1")
            super().run()
            return
        super().run()
        package = Path(self.build_lib) / "agentloop_grpc"
        generate_python(package / "v1")
        _copy_files(PROTOS, package / "protos", "agentloop/v1/*.proto")
        _copy_files(EXAMPLES, package / "examples", "*.yaml")


def _copy_files(source: Path, target: Path, pattern: str) -> None:
    files = sorted(source.glob(pattern))
    if not files:
        raise RuntimeError(f"the package build found no {pattern} under {source}")
    for path in files:
        destination = target / path.relative_to(source)
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, destination)


setup(cmdclass={"build_py": BuildPyWithProtos})
