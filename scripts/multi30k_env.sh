# Sourced by the Multi30k scripts (multi30k_recipe.sh, multi30k_val_sweep.sh): the direction,
# the raw data folder, the interpreter, and nmt(), which runs a console script through it.
#   DIRECTION  en-de (default) or de-en        RAW  folder of the Multi30k task 1 files
#   PYTHON     the interpreter with nmt installed (default .venv/bin/python if present)
# Sets SRC, TGT, RAW, PYTHON; the caller's name (for errors) is $SCRIPT.
DIRECTION=${DIRECTION:-en-de}
case "$DIRECTION" in
  en-de) SRC=en; TGT=de ;;
  de-en) SRC=de; TGT=en ;;
  *) echo "$SCRIPT: error: DIRECTION=$DIRECTION: use en-de or de-en" >&2; exit 2 ;;
esac
RAW=${RAW:-../shared/data/multi30k}
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python; fi
fi
# The console scripts, run through the chosen interpreter (no PATH or venv activation needed).
nmt() { "$PYTHON" -c "import sys; from nmt.cli import main; main(sys.argv[1], sys.argv[2:])" "$@"; }
