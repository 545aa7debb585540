#!/usr/bin/env bash
# The one device command (issue "On a GPU"): from the repository root of a checkout holding .gpu-carry/
# (made here by `python benchmarks/gpu_check.py prepare --data $CSEKIT_DATA`), with $OUT set by the device tool:
#   bash benchmarks/gpu_check.sh [BUDGET_SECONDS [gpu_check.py run options, e.g. --only loop --only compile]]
# It installs the carried wheels (what the GPU image lacks) into /tmp/site, then runs every stage of
# benchmarks/gpu_check.py; results land in $OUT (results.json, summary.md, profiles.md, log.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
CARRY=${CARRY:-.gpu-carry}
OUT=${OUT:?set OUT to the results folder}
python3 -m pip install -q --no-index --no-deps --target /tmp/site "$CARRY"/wheels/*.whl
export PYTHONPATH=/tmp/site:src${PYTHONPATH:+:$PYTHONPATH}
BUDGET=${1:-480}
shift || true
python3 benchmarks/gpu_check.py run --carry "$CARRY" --out "$OUT" --budget "$BUDGET" "$@"
