#!/usr/bin/env bash
# Run HERE (a machine with PyPI), from the repo root: downloads what the GPU machine lacks into
# .device/ (git-ignored), ready to be carried by the device tool. Nothing large is committed.
#
#   bash scripts/device/fetch_wheels.sh            # ~300 MB download, ~1 min
#
# Then follow scripts/device/README.md (one device call per TE core part, then `setup.sh install`).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
TE_VERSION="${TE_VERSION:-2.20.2}"
PLAT=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
mkdir -p .device/whl .device/parts .device/sdist
dl() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        "${PLAT[@]}" -d "$1" "${@:2}"; }
# Runtime deps of `import transformer_engine.pytorch` missing on the device image (see the facts
# note), plus yxanul's own deps the image lacks (datasets and its helpers; TRL and PEFT for the FP8-under-TRL tests).
dl .device/whl "transformer-engine==${TE_VERSION}" pydantic pydantic-core annotated-types typing-inspection \
   nvdlfw-inspect "nvidia-cudnn-frontend>=1.29" datasets multiprocess dill hjson "trl==1.16.0" "peft==0.21.2"
# DeepSpeed (ZeRO-1 GPU tests) is an sdist whose setup.py imports torch: build its pure-Python wheel
# here in pip's isolated build env (no torch needed: no ops prebuilt; DeepSpeed JIT-builds what it needs there).
DS_BUILD_OPS=0 python3 -m pip wheel -q --no-deps -w .device/whl "deepspeed==${DS_VERSION:-0.19.8}"
# The torch extension is an sdist only: built on the device (g++, no nvcc) by setup.sh.
# `pip download` of that sdist fails here (preparing its metadata needs a CUDA torch), so take the
# file straight from PyPI's simple index (JSON form) and check its sha256.
python3 - "$TE_VERSION" <<'PY'
import hashlib, json, sys, urllib.request
ver = sys.argv[1]
req = urllib.request.Request("https://pypi.org/simple/transformer-engine-torch/",
                             headers={"Accept": "application/vnd.pypi.simple.v1+json"})
files = json.load(urllib.request.urlopen(req, timeout=60))["files"]
f = next(f for f in files if f["filename"] == f"transformer_engine_torch-{ver}.tar.gz")
data = urllib.request.urlopen(f["url"], timeout=300).read()
assert hashlib.sha256(data).hexdigest() == f["hashes"]["sha256"], "sha256 mismatch"
open(f".device/sdist/{f['filename']}", "wb").write(data)
print("sdist", f["filename"], len(data), "bytes, sha256 ok")
PY
# The core library wheel is ~277 MB: split into parts that fit the 64 MiB carry limit.
tmp=$(mktemp -d)
dl "$tmp" "transformer-engine-cu13==${TE_VERSION}"
core=$(ls "$tmp"/transformer_engine_cu13-*.whl)
rm -f .device/parts/*
(cd "$tmp" && sha256sum "$(basename "$core")") > .device/parts/SHA256
split -b 55m -d "$core" ".device/parts/$(basename "$core").part"
rm -rf "$tmp"
du -sh .device/whl .device/sdist .device/parts
ls .device/parts
