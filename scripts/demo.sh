#!/usr/bin/env bash
# The whole nmt pipeline on the project's demo corpus (data/demo: English number phrases ->
# German), on the CPU: preprocess, train transformer_tiny, translate the test split, score.
# It prints each stage's progress and ends with the test BLEU.
#
# usage: scripts/demo.sh [WORKDIR]          (default WORKDIR: runs/demo)
#   WORKDIR holds the run (checkpoint_best.pt, ...), data-bin/ and test.hyp.de.
# Environment (defaults are the full demo; tests/integration/test_demo.py shortens it):
#   DEMO_EPOCHS=3        training epochs over the 10,000 demo pairs (58 updates each)
#   DEMO_MAX_UPDATE=0    stop training after this many updates (0 = no limit)
#   DEMO_BEAM=5          beam size for the test translation
#   DEMO_THREADS=0       torch CPU threads (0 = torch's default)
#   NMT_BIN=.venv/bin    where the nmt-* commands are
set -euo pipefail
cd "$(dirname "$0")/.."
W=${1:-runs/demo}
BIN=${NMT_BIN:-.venv/bin}
EPOCHS=${DEMO_EPOCHS:-3}
MAX_UPDATE=${DEMO_MAX_UPDATE:-0}
BEAM=${DEMO_BEAM:-5}
THREADS=${DEMO_THREADS:-0}

# Start from scratch, but only ever delete a directory this script made.
if [ -e "$W" ]; then
  if [ ! -f "$W/.nmt-demo" ]; then
    echo "demo.sh: $W exists and was not made by demo.sh; choose another WORKDIR" >&2
    exit 2
  fi
  rm -rf "$W"
fi
mkdir -p "$W"
touch "$W/.nmt-demo"
start=$(date +%s)

echo "== 1/4 preprocess data/demo -> $W/data-bin"
"$BIN/nmt-preprocess" data.trainpref=data/demo/train data.validpref=data/demo/valid \
  data.testpref=[data/demo/test] data.dest="$W/data-bin"

echo "== 2/4 train transformer_tiny ($EPOCHS epochs) -> $W"
# A short warmup and a high peak learning rate: the tiny model learns the demo task in a
# few hundred updates.
"$BIN/nmt-train" data="$W/data-bin" save_dir="$W" model=transformer_tiny \
  optim=adam_inverse_sqrt optim.lr=3e-3 optim.warmup_updates=100 max_tokens=2048 \
  max_epoch="$EPOCHS" max_update="$MAX_UPDATE" logging.interval=25 logging.tensorboard=false \
  threads="$THREADS"

echo "== 3/4 translate the test split (beam $BEAM) -> $W/test.hyp.de"
"$BIN/nmt-generate" checkpoint="$W/checkpoint_best.pt" input="$W/data-bin" split=test \
  output="$W/test.hyp.de" beam="$BEAM" max_len_a=1.5 max_len_b=10 threads="$THREADS"
paste -d '\n' <(head -n 3 data/demo/test.en | sed 's/^/  en:  /') \
  <(head -n 3 "$W/test.hyp.de" | sed 's/^/  nmt: /') <(head -n 3 data/demo/test.de | sed 's/^/  ref: /')

echo "== 4/4 score $W/test.hyp.de against data/demo/test.de"
"$BIN/nmt-score" hyp="$W/test.hyp.de" refs=data/demo/test.de metrics=[bleu,chrf]
echo "demo.sh: done in $(( $(date +%s) - start )) s; files in $W"
echo "demo.sh: from Python: from nmt import Translator; Translator.from_checkpoint(\"$W/checkpoint_best.pt\").translate([\"I bought twenty-one books.\"])"
