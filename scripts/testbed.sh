#!/usr/bin/env bash
# The testbed with headroom (issue 63): make the MLM-only stand-in (benchmarks/minilm_mlm_standin.py, once,
# into the ignored generators/), the other inputs of the controlled suite's recipes (scripts/controlled.sh's:
# SLT-FAI's token counts, OssCSE's augmented corpus, SNCSE's negations), then run benchmarks/suites/testbed.yaml
# at the lowest CPU priority. Every step can be run again: the stand-in is cached by its settings, freq rewrites
# its file, augment and bench continue where they stopped.
# Results, tables and plots land in $OUT (default runs/testbed); the papers' biases measured by `csekit diagnose`
# on every trained model in $OUT-diagnose (one JSON a run), their table printed last.
set -euo pipefail
cd "$(dirname "$0")/.."
export CSEKIT_DATA=${CSEKIT_DATA:-$(cd .. && pwd)/shared/data}
OUT=${OUT:-runs/testbed}
CSEKIT=${CSEKIT:-.venv/bin/csekit}
SENTENCES="$CSEKIT_DATA/corpus/sts_sick_unlabeled_sentences.txt"

echo "== the MLM-only stand-in (generators/minilm-mlm-standin)"
PYTHONPATH=src nice -n 19 "${PYTHON:-.venv/bin/python}" benchmarks/minilm_mlm_standin.py --measure
echo "== token counts for SLT-FAI (freq/sts_sick_minilm-l6.json: the stand-in keeps MiniLM's tokenizer)"
$CSEKIT freq --corpus "$SENTENCES" --tokenizer minilm-l6 --output freq/sts_sick_minilm-l6.json
echo "== negations and paraphrases for OssCSE (corpus/sts_sick_unlabeled_osscse.jsonl)"
$CSEKIT augment --corpus "$SENTENCES" --output corpus/sts_sick_unlabeled_osscse.jsonl --limit 20000
echo "== negations for SNCSE (corpus/sts_sick_unlabeled_sncse.jsonl)"
$CSEKIT augment --engine none --corpus "$SENTENCES" --output corpus/sts_sick_unlabeled_sncse.jsonl
echo "== the testbed suite -> $OUT"
nice -n 19 $CSEKIT bench benchmarks/suites/testbed.yaml --output "$OUT" --no-progress
echo "== the papers' biases on the trained models -> $OUT-diagnose"
PYTHONPATH=src nice -n 19 "${PYTHON:-.venv/bin/python}" benchmarks/suite_diagnose.py benchmarks/suites/testbed.yaml \
    --output "$OUT" --reports "$OUT-diagnose"
