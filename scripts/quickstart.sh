#!/usr/bin/env bash
# The main job: evaluate all-MiniLM-L6-v2 ([CLS] pooling) on the STS suite, train it with SimCSE on the
# 89,192 unlabeled STS/SICK sentences (recipes/quickstart.yaml, precision auto; 9 min on a 2-core Zen 3,
# docs/quickstart.md),
# then evaluate the trained model the same way. Results land in runs/quickstart/.
# Run again after an interruption (Ctrl-C, a closed terminal), it goes on where it stopped: the evaluation
# before training is kept once written, the training continues with --resume, then the evaluation after it.
set -euo pipefail
cd "$(dirname "$0")/.."
export CSEKIT_DATA=${CSEKIT_DATA:-$(cd .. && pwd)/shared/data}
OUT=${OUT:-runs/quickstart}
CSEKIT=.venv/bin/csekit

if [ -e "$OUT" ] && [ ! -d "$OUT" ]; then
  echo "$OUT is a file: remove it or set OUT=another/folder" >&2
  exit 2
fi
mkdir -p "$OUT"
if [ -s "$OUT/before.json" ]; then
  echo "== before training: kept from the last run ($OUT/before.json)"
else
  echo "== before training: all-MiniLM-L6-v2, cls pooler"
  $CSEKIT evaluate minilm-l6 --pooler cls --tasks sts --output "$OUT/before.json"
fi
if [ -e "$OUT/run/recipe.yaml" ] || [ -e "$OUT/run/metrics.jsonl" ] || [ -e "$OUT/run/checkpoint" ]; then
  echo "== training: continuing the run in $OUT/run (its saved recipe)"
  $CSEKIT train --output "$OUT/run" --resume
else
  echo "== training (recipes/quickstart.yaml)"
  $CSEKIT train recipes/quickstart.yaml --output "$OUT/run"
fi
echo "== after training: $OUT/run/best"
$CSEKIT evaluate "$OUT/run/best" --tasks sts --output "$OUT/after.json"
.venv/bin/python - "$OUT/before.json" "$OUT/after.json" <<'PY'
import json, sys
before, after = (json.load(open(p)) for p in sys.argv[1:3])
print(f"STS average (7 tasks, Spearman x 100): {100 * before['averages']['avg']:.2f} -> {100 * after['averages']['avg']:.2f} "
      "(all-MiniLM-L6-v2 with cls pooling; not a paper reproduction)")
PY
