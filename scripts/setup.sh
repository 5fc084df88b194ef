#!/usr/bin/env bash
# Sets up .venv with nmt and its dependencies.
#   CPU (default): torch 2.13.0, the CPU build (a local wheel on the project's machines).
#   GPU: NMT_TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128" bash scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
# torch first and pinned, so the dependency resolver never pulls a multi-GB CUDA build.
# shellcheck disable=SC2086
.venv/bin/python -m pip install -q ${NMT_TORCH:-torch==2.13.0}
.venv/bin/python -m pip install -q -e ".[test]"
.venv/bin/python -c "import torch; print(f'torch {torch.__version__}; CUDA build: {torch.version.cuda or \"none (CPU only)\"}; GPUs visible: {torch.cuda.device_count()}')"
# A CUDA index that cannot be reached lets a pip with local find-links fall back to a CPU wheel.
if [[ "${NMT_TORCH:-}" == *"/whl/cu"* ]] && ! .venv/bin/python -c "import sys, torch; sys.exit(torch.version.cuda is None)"; then
  echo "setup.sh: error: NMT_TORCH names a CUDA build, but pip installed a CPU one; see README, Installing with a GPU" >&2
  exit 1
fi
echo "nmt is set up in .venv (activate with: source .venv/bin/activate)"
