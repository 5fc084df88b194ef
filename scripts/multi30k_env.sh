# Sourced by the Multi30k scripts (multi30k_recipe.sh, multi30k_val_sweep.sh, backtranslate.sh):
# the direction, the raw data folder, the interpreter, and nmt(), which runs a console script
# through it.
#   DIRECTION  en-de (default), de-en, en-fr, ...  RAW  folder of the Multi30k task 1 files
#   PYTHON     the interpreter with nmt installed (default .venv/bin/python if present)
# Sets SRC, TGT, RAW, PYTHON; the caller's name (for errors) is $SCRIPT. smoke_train_args
# gives the nmt-train arguments of a SMOKE run.
DIRECTION=${DIRECTION:-en-de}
if [[ "$DIRECTION" =~ ^([A-Za-z][A-Za-z0-9_]*)-([A-Za-z][A-Za-z0-9_]*)$ ]] \
    && [ "${BASH_REMATCH[1]}" != "${BASH_REMATCH[2]}" ]; then
  SRC=${BASH_REMATCH[1]}; TGT=${BASH_REMATCH[2]}
else
  echo "$SCRIPT: error: DIRECTION=$DIRECTION: give source-target, e.g. en-de, de-en or en-fr" >&2
  exit 2
fi
RAW=${RAW:-../shared/data/multi30k}
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python; fi
fi
# The console scripts, run through the chosen interpreter (no PATH or venv activation needed).
nmt() { "$PYTHON" -c "import sys; from nmt.cli import main; main(sys.argv[1], sys.argv[2:])" "$@"; }
# smoke_train_args N AVG: SMOKE_ARGS, the nmt-train arguments of a SMOKE run: N updates, a
# checkpoint every N/3 (AVG of them kept, to be averaged), validation every N/2; the recipe's
# model, optimizer and max_time stay (max_update stops the run first)
smoke_train_args() {
  local n=$1 avg=$2
  SMOKE_ARGS=(max_update=$n checkpoint.save_interval_updates=$(( n / 3 > 0 ? n / 3 : 1 ))
              validation.interval_updates=$(( n / 2 > 0 ? n / 2 : 1 )) validation.every_epoch=false
              checkpoint.keep_last=$avg logging.interval=$(( n / 6 > 0 ? n / 6 : 1 )))
}
