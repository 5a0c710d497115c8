# shellcheck shell=bash
# Source in every device call after `setup.sh install` in the same lease.
export PYTHONPATH=/tmp/site:$PWD:${PYTHONPATH:-}   # TE + wheels, and this repo copy (yxanul)
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1
export PATH=/tmp/site/bin:$PATH
