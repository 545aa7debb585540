#!/usr/bin/env bash
# The second prepared GPU call (issue "On a GPU III", item 5; issue 62, item 3), after benchmarks/gpu_check.sh,
# from the repository root of a checkout holding .gpu-carry/, with $OUT set by the device tool:
#   DECODER_SECONDS=150 BENCH_SECONDS=150 bash benchmarks/gpu_suite.sh [gpu_suite.py subset options, e.g. --seeds 42]
# First the `decoder` stage (csekit's SimCSE step at LLM2Vec's 7B shape, padded and packed; too long for the first
# call) under its own deadline of DECODER_SECONDS (0 leaves it out), its results.json, summary.md and log.txt in
# $OUT/decoder/. Then trains the controlled suite's carried configurations for one epoch of the 89,192 sentences
# in bf16 under BENCH_SECONDS (0 leaves it out; a run cut off is listed, and `csekit bench --summary-only` tables
# what finished), and copies the tables and the runs' small files (metrics, results; no weights) to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
CARRY=${CARRY:-.gpu-carry}
OUT=${OUT:?set OUT to the results folder}
WORK=${WORK:-/tmp/gpu-suite}
export PYTHONPATH=$WORK/site:$PWD/src:$PWD/benchmarks
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
# the carried wheels the suite and the decoder stage need (omegaconf), into $WORK/site; a failed install is printed,
# never fatal
python3 benchmarks/gpu_check.py install --carry "$CARRY" --site "$WORK/site" --for suite --for decoder
DECODER_SECONDS=${DECODER_SECONDS:-150}
if [ "$DECODER_SECONDS" -gt 0 ]; then
    # the deadline counts from here, as gpu_check.sh's; the stage ends by it with what it measured
    GPU_CHECK_DEADLINE=$(($(date +%s) + DECODER_SECONDS)) python3 benchmarks/gpu_check.py run --carry "$CARRY" \
        --out "$OUT/decoder" --budget "$DECODER_SECONDS" --only decoder
    rm -f "$OUT/decoder/profiles.md"  # empty for this stage; the device tool returns 8 files at most
fi
BENCH_SECONDS=${BENCH_SECONDS:-150}
[ "$BENCH_SECONDS" -gt 0 ] || exit 0  # BENCH_SECONDS=0: the decoder stage alone
mkdir -p "$WORK/data" && tar xzf "$CARRY/data.tar.gz" -C "$WORK/data"
export CSEKIT_DATA=$WORK/data
python3 -c "import sys; from pathlib import Path; from gpu_check_stages import widened_copy; \
widened_copy(Path(sys.argv[1]), Path(sys.argv[2]))" "$CARRY/model" "$WORK/model"
python3 benchmarks/gpu_suite.py subset --out "$WORK/suite.yaml" --model "$WORK/model" "$@"
CSEKIT=(python3 -c "import sys; from csekit.cli import main; sys.argv[0] = 'csekit'; main()")
BENCH=(bench "$WORK/suite.yaml" --output "$WORK/runs" --no-progress --data-dir "$WORK/data" --set train.max_steps=null
    --set train.epochs=1 --set train.precision=bf16 --set train.eval_every=250)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
date -u
# csekit itself is timeout's child: on the limit it checkpoints the step it is on and exits, and timeout waits
timeout -k 60 "$BENCH_SECONDS" "${CSEKIT[@]}" "${BENCH[@]}" > "$OUT/bench_log.txt" 2>&1
echo "bench exit $?"; date -u
"${CSEKIT[@]}" "${BENCH[@]}" --summary-only >> "$OUT/bench_log.txt" 2>&1
cp "$WORK"/runs/results.* "$OUT"/ 2>/dev/null
(cd "$WORK/runs" && find . -name '*.json*' -size -2M ! -name 'tokenizer*' ! -name 'config*' ! -name 'vocab*' \
    | tar czf "$OUT/runs_small.tar.gz" -T -)
tail -30 "$OUT/bench_log.txt"
