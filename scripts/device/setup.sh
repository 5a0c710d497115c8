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
    if ls .device/built/transformer_engine_torch-*.whl >/dev/null 2>&1; then
      python3 -m pip install -q --no-index --no-deps --target /tmp/site .device/built/transformer_engine_torch-*.whl
    else
      site=$(python3 -c "import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))")
      export CPLUS_INCLUDE_PATH="$site/nvidia/cudnn/include:$site/nvidia/nccl/include:${CPLUS_INCLUDE_PATH:-}"
      export NVTE_FRAMEWORK=pytorch NVTE_PYTORCH_FORCE_BUILD=TRUE NVTE_NO_LOCAL_VERSION=1 MAX_JOBS=16
      mkdir -p /tmp/te/built
      python3 -m pip wheel -q --no-deps --no-build-isolation -w /tmp/te/built .device/sdist/transformer_engine_torch-*.tar.gz
      python3 -m pip install -q --no-index --no-deps --target /tmp/site /tmp/te/built/*.whl
      if [ -n "${OUT:-}" ]; then cp /tmp/te/built/*.whl "$OUT"/; fi
    fi
    python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site -e . 2>/dev/null \
      || python3 -m pip install -q --no-index --no-deps --target /tmp/site .
    echo "install took $(( $(date +%s) - t0 )) s"
    python3 - <<'PY'
import torch
import transformer_engine.pytorch as te
print("torch", torch.__version__, "TE", te.__version__ if hasattr(te, "__version__") else "?")
print("fp8 available:", te.is_fp8_available(return_reason=True))
PY
    ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
