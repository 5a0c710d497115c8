#!/usr/bin/env bash
# Run THERE (the GPU machine), from the repo root, through the device tool. Stages:
#   bash scripts/device/setup.sh part N   carry .device/parts/*.partNN only: appends it to /tmp/te/
#   bash scripts/device/setup.sh install  carry .device/whl + .device/sdist (+ the last part):
#                                         reassembles, checks sha256, installs into /tmp/site,
#                                         builds the TE torch extension (kept in /tmp/te/built and
#                                         copied to $OUT so it can be carried next time), verifies.
#   source scripts/device/env.sh          in every later call of the same lease
# Files outside the repo copy survive between calls only while the machine stays warm (30 s idle):
# make the calls back to back.
set -euo pipefail
stage="${1:?stage: part N | install}"
mkdir -p /tmp/te /tmp/site
case "$stage" in
  part)
    n=$(printf '%02d' "${2:?part number}")
    cp .device/parts/*.part"$n" /tmp/te/
    ls -la /tmp/te
    ;;
  install)
    t0=$(date +%s)
    cp .device/parts/*.part* /tmp/te/ 2>/dev/null || true
    cp .device/parts/SHA256 /tmp/te/
    whl=$(awk '{print $2}' /tmp/te/SHA256)
    cat /tmp/te/"$whl".part* > /tmp/te/"$whl"
    (cd /tmp/te && sha256sum -c SHA256)
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/te/"$whl" .device/whl/*.whl
    export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
    ext=(.device/built/transformer_engine_torch-*-cp312-*.whl)
    if [ ! -f "${ext[0]}" ]; then
      # Prefer the wheel built on a CPU machine (scripts/device/cpu_te_env.sh -> .device/built).
      # Fallback, g++ on this machine: CUDA 13 keeps CCCL (nv/target, included by cuda_fp16.h)
      # under include/cccl, which only nvcc adds by itself (seen when building on CPU).
      site=$(python3 -c "import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))")
      cuda_home=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")}
      export CPLUS_INCLUDE_PATH="$cuda_home/include/cccl:$site/nvidia/cu13/include/cccl:$site/nvidia/cudnn/include:$site/nvidia/nccl/include:${CPLUS_INCLUDE_PATH:-}"
      export NVTE_FRAMEWORK=pytorch NVTE_PYTORCH_FORCE_BUILD=TRUE NVTE_NO_LOCAL_VERSION=1 MAX_JOBS=16
      mkdir -p /tmp/te/built
      python3 -m pip wheel -q --no-deps --no-build-isolation -w /tmp/te/built .device/sdist/transformer_engine_torch-*.tar.gz
      if [ -n "${OUT:-}" ]; then cp /tmp/te/built/*.whl "$OUT"/; fi
      ext=(/tmp/te/built/transformer_engine_torch-*.whl)
    fi
    # Its files go INTO transformer_engine/ (wheel_lib/): `pip install --target` skips a top-level
    # folder that already exists ("Target directory ... already exists"), so install it apart and merge.
    rm -rf /tmp/te/ext
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/te/ext "${ext[0]}"
    cp -a /tmp/te/ext/. /tmp/site/
    ls /tmp/site/transformer_engine/wheel_lib/transformer_engine_torch*.so
    # yxanul itself is not installed: every call runs in the repo copy, which env.sh puts on PYTHONPATH.
    echo "install took $(( $(date +%s) - t0 )) s"
    python3 - <<'PY'
import torch
import transformer_engine.pytorch as te
import transformer_engine
print("torch", torch.__version__, "TE", transformer_engine.__version__)
try:
    print("fp8 available:", te.is_fp8_available(return_reason=True))
except RuntimeError as e:  # no driver (a CPU rehearsal of this script)
    print("fp8 available: no:", str(e).splitlines()[0])
PY
    ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
