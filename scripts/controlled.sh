#!/usr/bin/env bash
# The controlled comparison of docs/results.md: make the four inputs its recipes read (SLT-FAI's token counts,
# OssCSE's augmented corpus, SNCSE's negations, DiffCSE's stand-in generator; all in ignored folders of the
# repository), then run benchmarks/suites/controlled.yaml (at the lowest CPU priority). Every step can be run
# again: freq rewrites its file, augment and bench continue where they stopped (finished runs are skipped), the
# generator is made once.
# Results, tables and plots land in $OUT (default runs/controlled).
set -euo pipefail
cd "$(dirname "$0")/.."
export CSEKIT_DATA=${CSEKIT_DATA:-$(cd .. && pwd)/shared/data}
OUT=${OUT:-runs/controlled}
CSEKIT=${CSEKIT:-.venv/bin/csekit}
SENTENCES="$CSEKIT_DATA/corpus/sts_sick_unlabeled_sentences.txt"

echo "== token counts for SLT-FAI (freq/sts_sick_minilm-l6.json)"
$CSEKIT freq --corpus "$SENTENCES" --tokenizer minilm-l6 --output freq/sts_sick_minilm-l6.json
echo "== negations and paraphrases for OssCSE (corpus/sts_sick_unlabeled_osscse.jsonl)"
$CSEKIT augment --corpus "$SENTENCES" --output corpus/sts_sick_unlabeled_osscse.jsonl --limit 20000
echo "== negations for SNCSE (corpus/sts_sick_unlabeled_sncse.jsonl)"
$CSEKIT augment --engine none --corpus "$SENTENCES" --output corpus/sts_sick_unlabeled_sncse.jsonl
echo "== DiffCSE's generator: all-MiniLM-L6-v2 given an MLM head (generators/minilm-mlm)"
if [ ! -d generators/minilm-mlm ]; then
    PYTHONPATH=src nice -n 19 "${PYTHON:-.venv/bin/python}" benchmarks/minilm_mlm_generator.py --output generators/minilm-mlm
fi
echo "== the controlled suite -> $OUT"
nice -n 19 $CSEKIT bench benchmarks/suites/controlled.yaml --output "$OUT" --no-progress
