#!/usr/bin/env bash
# Run HERE (a CPU machine with PyPI), from the repo root, after fetch_wheels.sh. No GPU needed.
#
# Builds a Python 3.12 venv that matches the GPU image (Python 3.12, torch 2.11.0 = CUDA 13.0 on
# PyPI, transformers 5.17, accelerate 1.15) with the REAL Transformer Engine in it:
#   - the TE core wheel (.device/parts, reassembled; its CUDA libraries load without a driver),
#   - the TE torch extension, built from the sdist with g++ against CUDA headers from PyPI
#     (cuda-toolkit[nvcc,cccl]: crt/host_config.h and nv/target; nothing is compiled by nvcc).
# Products:
#   .device/built/transformer_engine_torch-*.whl   carried to the device: setup.sh install then
#                                                  skips the build there
#   $VENV (default /tmp/yx-te) with TE + yxanul:   $VENV/bin/python -m pytest -m te
#     runs the `te` tests (TE module trees on the meta device, recipes, accelerate + TE) on a CPU.
# Cost here: ~5 GB of downloads (torch + CUDA wheels), ~10 min to compile on 2 cores.
# `import transformer_engine` needs torch imported first (libnccl.so.2 comes from torch's RPATH):
# yxanul._te does that.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
VENV="${VENV:-/tmp/yx-te}"
PY="${PYTHON312:-python3.12}"
TE_VERSION="${TE_VERSION:-2.20.2}"
"$PY" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null \
  || { echo "needs Python 3.12 (the GPU image's): set PYTHON312=/path/to/python3.12" >&2; exit 2; }
ls .device/parts/SHA256 .device/sdist/transformer_engine_torch-"$TE_VERSION".tar.gz >/dev/null \
  || { echo "run scripts/device/fetch_wheels.sh first" >&2; exit 2; }
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip)
"${pip[@]}" install -q --upgrade pip wheel "setuptools<82"
"${pip[@]}" install -q torch==2.11.0 "cuda-toolkit[nvcc,cccl]==13.0.2" ninja packaging pybind11 \
  "nvidia-cudnn-frontend>=1.29" einops onnx onnxscript pydantic nvdlfw-inspect importlib-metadata
tmp=$(mktemp -d)
whl=$(awk '{print $2}' .device/parts/SHA256)
cat .device/parts/"$whl".part* > "$tmp/$whl"
(cd "$tmp" && sha256sum -c "$OLDPWD/.device/parts/SHA256")
"${pip[@]}" install -q --no-deps "$tmp/$whl" .device/whl/transformer_engine-"$TE_VERSION"-*.whl
rm -rf "$tmp"
if ! ls .device/built/transformer_engine_torch-"$TE_VERSION"-cp312-*.whl >/dev/null 2>&1; then
  mkdir -p .device/built
  t0=$(date +%s)
  # NVTE_CUDA_ARCHS: TE's default when nvcc reports CUDA 13; it includes 90, which turns the NCCL EP
  # bindings on, as in the core wheel (libtransformer_engine.so exports nvte_ep_*).
  NVTE_FRAMEWORK=pytorch NVTE_PYTORCH_FORCE_BUILD=TRUE NVTE_BUILD_USE_NVIDIA_WHEELS=1 NVTE_NO_LOCAL_VERSION=1 \
  NVTE_CUDA_ARCHS="75;80;89;90;100;120" MAX_JOBS="$(nproc)" \
    "${pip[@]}" wheel -q --no-deps --no-build-isolation -w .device/built \
      .device/sdist/transformer_engine_torch-"$TE_VERSION".tar.gz
  echo "torch extension built in $(( $(date +%s) - t0 )) s"
fi
"${pip[@]}" install -q --no-deps --force-reinstall .device/built/transformer_engine_torch-"$TE_VERSION"-cp312-*.whl
"${pip[@]}" install -q "transformers==5.17.0" "accelerate==1.15.0" -e ".[dev]"
"$VENV/bin/python" -c "from yxanul import _te; assert _te.TE_AVAILABLE, _te.TE_IMPORT_ERROR; print('TE', _te.te_version, 'imports')"
echo "now: $VENV/bin/python -m pytest -m te -q"
