#!/usr/bin/env bash
# The first device call (issue "On a GPU"): from the repository root of a checkout holding .gpu-carry/
# (made here by `python benchmarks/gpu_check.py prepare --data $CSEKIT_DATA`), with $OUT set by the device tool:
#   bash benchmarks/gpu_check.sh [BUDGET_SECONDS [gpu_check.py run options, e.g. --only loop --only compile]]
# The budget (default 300 s) counts from here: the deadline is set before anything else, so the wheels' install
# and every stage fit in it. Every stage runs in its own process group under its share of it, with absolute
# paths and the hub offline; the carried wheels a chosen stage needs go to /tmp/gpu-check-site. Results land in
# $OUT (results.json, summary.md, profiles.md, log.txt), rewritten after every stage.
set -uo pipefail
BUDGET=${1:-300}
shift || true
export GPU_CHECK_DEADLINE=$(($(date +%s) + ${BUDGET%.*}))
cd "$(dirname "$0")/.."
CARRY=${CARRY:-.gpu-carry}
OUT=${OUT:?set OUT to the results folder}
export PYTHONPATH=$PWD/src:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
python3 benchmarks/gpu_check.py run --carry "$CARRY" --out "$OUT" --budget "$BUDGET" --site /tmp/gpu-check-site "$@"
