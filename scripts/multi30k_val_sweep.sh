#!/usr/bin/env bash
# Inference choices of a finished Multi30k recipe run, scored on the validation set (val),
# never on test_2016_flickr: which checkpoints to average, the beam and the length penalty.
# One line per choice: the choice, sacreBLEU on val, and the seconds its translation took.
#
# usage (from the repository root, after scripts/multi30k_recipe.sh):
#   scripts/multi30k_val_sweep.sh                          # en-de, the recipe's run in work/multi30k
#   DIRECTION=de-en scripts/multi30k_val_sweep.sh          # de-en, the same model (BOTH_WAYS)
#   AVGS="3 5 8" BEAMS="5" LENPENS="0.6 1.0 1.4" scripts/multi30k_val_sweep.sh
#   BOTH_WAYS=0 DIRECTION=de-en scripts/multi30k_val_sweep.sh   # a one-direction run
#
# Environment (all optional): DIRECTION, RAW, WORK, BOTH_WAYS, PYTHON as in multi30k_recipe.sh;
#   RUN      the run dir; default: with BOTH_WAYS=1 (the recipe's default) runs/<src>_<tgt>_both
#            or, if only that exists, runs/<tgt>_<src>_both (one model serves both
#            directions); with BOTH_WAYS=0, runs/<src>_<tgt>; all in $WORK
#   AVGS     numbers of newest epoch checkpoints to average (default "3 5"; 1 = the last alone),
#            or shares of the run's updates whose checkpoints to average ("0.4": the last 40%),
#            or emaK: the moving averages of the weights (a run trained with checkpoint.ema_decay > 0)
#            saved in the newest K checkpoints, averaged ("ema1": the final one alone)
#   BEAMS    beam sizes (default "5")      LENPENS  length penalties (default "1.0")
# Every averaging is crossed with every beam and length penalty. Outputs go to
# <run>/val_sweep/ (translations and averaged checkpoints; re-runs reuse the averages).
set -euo pipefail

SCRIPT=multi30k_val_sweep
source "$(dirname "$0")/multi30k_env.sh"
WORK=${WORK:-work/multi30k}
AVGS=${AVGS:-3 5}
BEAMS=${BEAMS:-5}
LENPENS=${LENPENS:-1.0}
BOTH_WAYS=${BOTH_WAYS:-1}
case "$BOTH_WAYS" in
  0) CANDIDATES=("$WORK/runs/${SRC}_${TGT}") ;;
  1) CANDIDATES=("$WORK/runs/${SRC}_${TGT}_both" "$WORK/runs/${TGT}_${SRC}_both") ;;
  *) echo "multi30k_val_sweep: error: BOTH_WAYS=$BOTH_WAYS: use 1 (both directions) or 0" >&2; exit 2 ;;
esac
if [ -z "${RUN:-}" ]; then
  RUN=${CANDIDATES[0]}
  for dir in "${CANDIDATES[@]}"; do
    if [ -f "$dir/checkpoint_last.pt" ]; then RUN=$dir; break; fi
  done
fi
if [ ! -f "$RUN/checkpoint_last.pt" ]; then
  echo "multi30k_val_sweep: error: $RUN/checkpoint_last.pt: missing; run scripts/multi30k_recipe.sh first" >&2
  exit 2
fi
echo "== multi30k_val_sweep [$DIRECTION]: $RUN" >&2
OUT="$RUN/val_sweep"
mkdir -p "$OUT"

printf '%-10s %5s %7s %9s %8s\n' average beam lenpen "val BLEU" seconds
for avg in $AVGS; do
  case "$avg" in  # a whole number K: the newest K; a share such as 0.4: the last 40% of updates
    ema*) pick=("num_last=${avg#ema}" weights=ema) ;;
    *.*) pick=("last_fraction=$avg") ;;
    *) pick=("num_last=$avg") ;;
  esac
  ckpt="$OUT/avg_last$avg.pt"
  if [ ! -f "$ckpt" ]; then
    nmt average inputs="$RUN" "${pick[@]}" output="$ckpt" > "$ckpt.log" 2>&1 ||
      { cat "$ckpt.log" >&2; exit 1; }
  fi
  for beam in $BEAMS; do
    for lenpen in $LENPENS; do
      hyp="$OUT/val.avg$avg.beam$beam.lenpen$lenpen.$TGT"
      start=$(date +%s%N)
      nmt generate checkpoint="$ckpt" input="$RAW/val.$SRC" output="$hyp" beam="$beam" \
        lenpen="$lenpen" device=cpu threads=2 progress=false 2> "$hyp.log" ||
        { cat "$hyp.log" >&2; exit 1; }
      ms=$(( ($(date +%s%N) - start) / 1000000 ))
      bleu=$(nmt score hyp="$hyp" refs="$RAW/val.$TGT" metrics=[bleu] |
             sed -n 's/^BLEU[^=]*= \([0-9.]*\) .*/\1/p' | head -n 1)
      printf '%-10s %5s %7s %9s %6d.%d\n' "last$avg" "$beam" "$lenpen" "$bleu" $((ms / 1000)) $((ms % 1000 / 100))
    done
  done
done
