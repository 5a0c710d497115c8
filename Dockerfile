# yxanul on NVIDIA's PyTorch container, which already ships CUDA, cuDNN, NCCL, a CUDA build of
# torch and Transformer Engine (so FP8 works without building TE).
#   docker build -t yxanul:latest .
#   docker run --gpus all --ipc=host --ulimit memlock=-1 --ulimit stack=67108864 \
#       -v "$PWD/runs:/workspace/yxanul/runs" yxanul:latest \
#       accelerate launch --config_file accelerate_configs/single_gpu_fp8.yaml train.py --config examples/configs/test_fp8.yaml
# Pick a recent tag from https://catalog.ngc.nvidia.com/orgs/nvidia/containers/pytorch (YY.MM-py3).
ARG BASE_IMAGE=nvcr.io/nvidia/pytorch:25.10-py3
FROM ${BASE_IMAGE}

ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    HF_HOME=/workspace/yxanul/runs/hf_cache

WORKDIR /workspace/yxanul
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Dependencies first (cached layer). The constraints file pins the container's own torch and
# Transformer Engine so pip never replaces NGC's CUDA builds with PyPI wheels.
COPY setup.cfg pyproject.toml README.md ./
COPY yxanul/__init__.py yxanul/__init__.py
RUN pip list --format=freeze | grep -iE '^(torch|transformer[-_]engine[-_a-z0-9]*|numpy)==' > /tmp/constraints.txt \
    && pip install --constraint /tmp/constraints.txt ".[deepspeed]" \
    && pip uninstall -y yxanul

COPY . .
RUN pip install --constraint /tmp/constraints.txt --no-deps -e . \
    && python -c "import yxanul, accelerate, deepspeed; print('yxanul', yxanul.__version__)"

# `yxanul verify` checks the GPU / TE / FP8 stack at run time (no GPU during docker build).
CMD ["yxanul", "verify"]
