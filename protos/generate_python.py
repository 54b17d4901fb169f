"""Generate the Python stubs of the agentloop.v1 contracts into ``agentloop_grpc/v1/``.

Run by ``make protos`` and by the package build (``setup.py``), so a wheel carries the stubs while the repository
never tracks them. protoc names modules after the proto path (``agentloop.v1``); the stubs live inside our package,
so the cross-module imports the plugins write are rewritten to ``agentloop_grpc.v1``. Output is deterministic:
running it twice gives identical files.

Usage: ``python protos/generate_python.py [OUT_DIR]`` (default: ``agentloop_grpc/v1`` next to this folder).
"""

from __future__ import annotations

import re
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parent
PROTO_PACKAGE_DIR = Path("agentloop") / "v1"
DEFAULT_OUT = PROTO_ROOT.parent / "agentloop_grpc" / "v1"
_IMPORT_PATTERN = re.compile(r"^(from|import) agentloop\.v1\b", re.MULTILINE)


def _plugin(name: str) -> str:
    """Path of a protoc plugin installed beside this interpreter (build environments may not be on PATH)."""
    candidates = [Path(sysconfig.get_path("scripts")) / name, Path(sys.executable).parent / name]
    for candidate in candidates:
        if candidate.exists():
            return str(candidate)
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"protoc plugin {name!r} not found; install mypy-protobuf")
    return found


def generate_python(out_dir: Path = DEFAULT_OUT) -> list[Path]:
    """Write ``*_pb2.py``, ``*_pb2_grpc.py`` and their ``.pyi`` stubs to ``out_dir``; return the written paths."""
    from grpc_tools import protoc  # build-time dependency only

    protos = sorted((PROTO_ROOT / PROTO_PACKAGE_DIR).glob("*.proto"))
    if not protos:
        raise RuntimeError(f"no .proto files under {PROTO_ROOT / PROTO_PACKAGE_DIR}")
    grpc_include = Path(protoc.__file__).resolve().parent / "_proto"
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "grpc_tools.protoc",
            f"-I{PROTO_ROOT}",
            f"-I{grpc_include}",
            f"--python_out={tmp}",
            f"--grpc_python_out={tmp}",
            f"--mypy_out={tmp}",
            f"--mypy_grpc_out={tmp}",
            f"--plugin=protoc-gen-mypy={_plugin('protoc-gen-mypy')}",
            f"--plugin=protoc-gen-mypy_grpc={_plugin('protoc-gen-mypy_grpc')}",
            *(str(p.relative_to(PROTO_ROOT)) for p in protos),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError("protoc failed; see the messages above")
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for generated in sorted((Path(tmp) / PROTO_PACKAGE_DIR).iterdir()):
            text = _IMPORT_PATTERN.sub(r"\1 agentloop_grpc.v1", generated.read_text())
            target = out_dir / generated.name
            if not target.exists() or target.read_text() != text:
                target.write_text(text)
            written.append(target)
    return written


def main(argv: list[str]) -> int:
    out_dir = Path(argv[1]) if len(argv) > 1 else DEFAULT_OUT
    for path in generate_python(out_dir):
        print(f"generated {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
