#!/usr/bin/env bash
# Install the GPU kit offline: a new venv at $1 holding the kit's wheels (this project, its stubs, what the GPU
# machine lacks), in front of every package of $PYTHON (default python3: the interpreter that holds torch).
#
#   bash install.sh VENV [MORE_WHEEL_DIRS...]
#
# MORE_WHEEL_DIRS: wheels of the same pins for another Python than the GPU machine's (this repository's tests
# install the kit on their own Python). Nothing is fetched: no index, no pip configuration, only these folders.
set -euo pipefail
KIT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
VENV=${1:?usage: install.sh VENV [MORE_WHEEL_DIRS...]}
shift
PYTHON=${PYTHON:-python3}

# No --system-site-packages: the machine's python3 may itself be a venv, whose packages a venv made from it would
# not see. A .pth file adds that interpreter's site folders (their own .pth files processed) after the kit's.
"$PYTHON" -m venv --without-pip "$VENV"
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$PYTHON" -c '
import sys
folders = [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
print("import site; list(map(site.addsitedir, %r))" % folders)' > "$SITE/zz_gpu_kit_base_python.pth"

FIND=(--find-links "$KIT/wheels")
for folder in "$@"; do FIND+=(--find-links "$folder"); done
for name in $(compgen -e); do
    if [[ $name == PIP_* ]]; then unset "$name"; fi
done
PIP_WHEEL=$(ls "$KIT"/wheels/pip-*.whl)
# pip runs from its own wheel (the kit's version, whatever the machine has); packages the base interpreter already
# has at a version the requirements accept are kept, the rest comes from the kit's wheels
PIP_CONFIG_FILE=/dev/null "$VENV/bin/python" "$PIP_WHEEL/pip" install --quiet --no-index --no-compile \
    --no-cache-dir --root-user-action=ignore --disable-pip-version-check "${FIND[@]}" -r "$KIT/requirements.txt"
# every module the check needs is found (-I: not the current folder's, e.g. a checkout without stubs)
"$VENV/bin/python" -I -c '
import importlib.metadata as m, importlib.util as u
missing = [n for n in ("agentloop_grpc", "pydantic", "xgrammar", "grpc_health", "grpc_reflection", "pytest_asyncio",
                       "torch", "transformers") if u.find_spec(n) is None]
if missing:
    raise SystemExit(f"gpu kit: the venv lacks {missing}")
print("gpu kit installed:", ", ".join(f"{n} {m.version(n)}" for n in ("agentloop-grpc", "torch", "transformers")))'
