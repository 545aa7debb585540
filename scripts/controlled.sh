#!/usr/bin/env bash
# The controlled comparison of docs/results.md: make the three inputs its recipes read (SLT-FAI's token counts,
# OssCSE's augmented corpus, SNCSE's negations; all in ignored folders of the repository), then run
# benchmarks/suites/controlled.yaml (12 configurations x 3 seeds, at the lowest CPU priority). Every step can be
# run again: freq rewrites its file, augment and bench continue where they stopped (finished runs are skipped).
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
echo "== the controlled suite -> $OUT"
nice -n 19 $CSEKIT bench benchmarks/suites/controlled.yaml --output "$OUT" --no-progress
