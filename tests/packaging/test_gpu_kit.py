"""The GPU kit (``make gpu-kit``, bench/gpu_kit/) installs with the network off and runs ``gpu_check --device cpu``.

The GPU machine's python3 holds torch, transformers and a list of other packages (its image, read 2026-11-17:
``DEVICE_PACKAGES``) and lacks pydantic, grpcio-health-checking, grpcio-reflection, xgrammar and others. Here a
stand-in for it is a venv whose site-packages links the packages of this venv that the list names, with what this
venv's versions of them require, but never a package the kit carries that the list lacks (pydantic, which this
typer requires, stays out: the kit must bring it). The kit's install.sh makes its venv in front of that one,
inside a network namespace of its own (``unshare -n``, only loopback up), and the check runs there from the kit's
folder alone, with the kit's wheels for 3.12 and, for the compiled ones, the same pins for this Python
(``build/gpu-kit-host-wheels``).

What this proves: the kit brings every module the check imports that the machine's list lacks, installs with no
index, and its check passes on a CPU. What it does not: the machine's exact versions (torch 2.11 and transformers
5.17 there, this venv's here), Python 3.12's compiled wheels (fetched for 3.12, never installed here), CUDA.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
KIT = REPO / "build" / "gpu-kit"
HOST_WHEELS = REPO / "build" / "gpu-kit-host-wheels"
#: The GPU machine's python3 packages (/work/.library/device/KINDS.md, as read on 2026-11-17).
DEVICE_PACKAGES = frozenset(canonicalize_name(name) for name in """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna
imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft
pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six
sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile
tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm
transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel
wrapt xarray xxhash yarl zipp
""".split())
#: What the kit must bring (the issue's list of what the machine lacks, and what the check's path imports with it).
LACKING = ("pydantic", "grpc_health", "grpc_reflection", "xgrammar", "jsonschema", "pytest_asyncio", "agentloop_grpc")


def _device_set(source: Path, lacking: frozenset[str]) -> frozenset[str]:
    """The distributions of ``source`` the stand-in holds: DEVICE_PACKAGES and their requirements (as this venv's
    versions state them, extras aside), transitively, never one of ``lacking``."""
    dists = {canonicalize_name(d.metadata["Name"]): d for d in importlib.metadata.distributions(path=[str(source)])}
    keep, todo = set(), [name for name in DEVICE_PACKAGES if name in dists]
    while todo:
        name = todo.pop()
        if name in keep or name in lacking or name not in dists:
            continue
        keep.add(name)
        for requirement in map(Requirement, dists[name].requires or ()):
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(canonicalize_name(requirement.name))
    return frozenset(keep)


def _link_packages(source: Path, target: Path, keep: frozenset[str]) -> None:
    """Link into ``target`` the files of every distribution in ``source`` whose name is in ``keep``: a top-level
    folder owned by kept distributions only as one link, one shared with others (``google``) file by file."""
    owners: dict[str, set[str]] = {}
    files: dict[str, list[Path]] = {}
    for dist in importlib.metadata.distributions(path=[str(source)]):
        name = canonicalize_name(dist.metadata["Name"])
        for file in dist.files or ():
            if file.parts[0] == "..":  # console scripts, outside site-packages
                continue
            owners.setdefault(file.parts[0], set()).add(name)
            if name in keep:
                files.setdefault(file.parts[0], []).append(Path(file))
    for top, names in owners.items():
        if not names & keep or not (source / top).exists():
            continue
        if names <= keep:
            (target / top).symlink_to(source / top)
            continue
        for path in files[top]:
            if (source / path).is_file() and not (target / path).exists():
                (target / path).parent.mkdir(parents=True, exist_ok=True)
                (target / path).symlink_to(source / path)


def _offline(*args: str | Path, **kwargs) -> subprocess.CompletedProcess:
    """Run a command in a network namespace of its own: loopback up, nothing else reachable."""
    command = " ".join(f"'{arg}'" for arg in args)
    return subprocess.run(["unshare", "-n", "bash", "-c", f"ip link set lo up && exec {command}"], capture_output=True,
                          text=True, **kwargs)


@pytest.fixture(scope="module")
def kit() -> Path:
    if subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode != 0:
        pytest.skip("unshare -n is not permitted here (it needs root): no network namespace to install in")
    if not (KIT / "install.sh").is_file() or not HOST_WHEELS.is_dir():
        pytest.fail("no GPU kit: run `make gpu-kit` (make test builds it first)")
    return KIT


@pytest.fixture(scope="module")
def device_python(kit, tmp_path_factory) -> Path:
    """A Python whose packages are this venv's that the GPU machine also has (see the module docstring)."""
    root = tmp_path_factory.mktemp("device") / "python"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    carried = {parse_wheel_filename(wheel.name)[0] for wheel in (kit / "wheels").glob("*.whl")}
    source = Path(sysconfig.get_paths()["purelib"])
    _link_packages(source, site, _device_set(source, frozenset(carried - DEVICE_PACKAGES)))
    return python


def test_the_kit_is_under_60_mib_and_holds_the_wheels_for_python_3_12(kit) -> None:
    size = sum(path.stat().st_size for path in kit.rglob("*") if path.is_file())
    assert size < 60 * 2**20
    wheels = {path.name.split("-")[0].lower(): path.name for path in (kit / "wheels").glob("*.whl")}
    for name in ("pydantic_core", "grpcio", "xgrammar", "rpds_py"):
        assert "-cp312-" in wheels[name], wheels[name]
    assert "agentloop_grpc" in wheels and (kit / "model" / "tokenizer.json").is_file()


def test_the_stand_in_lacks_what_the_machine_lacks(device_python) -> None:
    modules = (*LACKING, "torch", "transformers")
    found = subprocess.run([device_python, "-c", "import importlib.util as u, sys; "
                            "print(*[u.find_spec(m) is not None for m in sys.argv[1:]])", *modules],
                           cwd=device_python.parent, capture_output=True, text=True, check=True).stdout.split()
    assert dict(zip(modules, found)) == {m: str(m in ("torch", "transformers")) for m in modules}


def test_the_kit_installs_offline_and_its_check_passes_on_a_cpu(kit, device_python, tmp_path) -> None:
    venv = tmp_path / "kit-venv"
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PIP_", "PYTHON"))}
    installed = _offline("bash", kit / "install.sh", venv, HOST_WHEELS, env={**env, "PYTHON": str(device_python)},
                         timeout=240)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert "gpu kit installed: agentloop-grpc" in installed.stdout
    where = subprocess.run([venv / "bin" / "python", "-c", "import agentloop_grpc, pydantic; "
                            "print(agentloop_grpc.__file__); print(pydantic.__file__)"], cwd=tmp_path,
                           capture_output=True, text=True, check=True).stdout.split()
    assert all(Path(path).is_relative_to(venv) for path in where), where  # the kit's, not this checkout's

    out = tmp_path / "out"
    checked = _offline(venv / "bin" / "python", kit / "gpu_check.py", "--device", "cpu", "--out", out,
                       cwd=tmp_path, env={**env, "HF_HUB_OFFLINE": "1"}, timeout=300)
    assert checked.returncode == 0, checked.stdout[-4000:] + checked.stderr[-4000:]
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["failed"] == []
    assert set(report["parts"]) >= {"throughput", "sleep", "naive_generate", "contract", "failover", "weight_push"}
    assert report["parts"]["contract"]["passed"] >= 4 and report["parts"]["contract"]["failed"] == 0
    assert report["parts"]["failover"]["failovers"] == 1
    table = (out / "gpu_check.md").read_text()
    assert "| failover: SIGKILL after" in table and "| in flight | embedded tok/s" in table
