#!/usr/bin/env bash
# Sets up .venv with nmt and its dependencies.
#   torch: torch==2.13.0 from PyPI (on Linux x86-64 the CUDA 13 build, on macOS and ARM a
#   CPU build); another build with NMT_TORCH, e.g. CPU only on Linux x86-64:
#   NMT_TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" bash scripts/setup.sh
#   Extras: NMT_EXTRAS (default test: serving, TensorBoard and the test tools, which the
#   demo and the tests need); NMT_EXTRAS=serve,tensorboard for a user's set, NMT_EXTRAS=
#   for nmt alone (no nmt-serve, no TensorBoard scalars).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
EXTRAS=${NMT_EXTRAS-test}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
# torch first and pinned, so the dependency resolver never pulls a multi-GB CUDA build.
# shellcheck disable=SC2086
.venv/bin/python -m pip install -q ${NMT_TORCH:-torch==2.13.0}
.venv/bin/python -m pip install -qq -e ".${EXTRAS:+[$EXTRAS]}"  # -qq: setuptools' note on the trap below
# An editable install finds nmt through an import hook that Python asks last, after its own
# search of sys.path: from the folder that holds the clone (itself named nmt), that search
# takes the clone for an empty namespace package, and `from nmt import Translator` fails.
# With the checkout on sys.path, as a plain .pth puts it, the search finds the real package.
SITE=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
pwd >"$SITE/nmt-checkout.pth"
.venv/bin/python -c "import torch; print(f'torch {torch.__version__}; CUDA build: {torch.version.cuda or \"none (CPU only)\"}; GPUs visible: {torch.cuda.device_count()}')"
# A CUDA index that cannot be reached lets a pip with local find-links fall back to a CPU wheel.
if [[ "${NMT_TORCH:-}" == *"/whl/cu"* ]] && ! .venv/bin/python -c "import sys, torch; sys.exit(torch.version.cuda is None)"; then
  echo "setup.sh: error: NMT_TORCH names a CUDA build, but pip installed a CPU one; see docs/performance.md, GPUs" >&2
  exit 1
fi
echo "nmt is set up in .venv. Put its commands (nmt-train, ...) on PATH with: source .venv/bin/activate"
