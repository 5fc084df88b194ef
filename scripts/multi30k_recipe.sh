#!/usr/bin/env bash
# The Multi30k recipe, from raw text to a BLEU score with its sacrebleu signature:
#   1. nmt-preprocess: joint unigram SentencePiece (VOCAB pieces, default 8k), binarized
#      train/valid/test_2016_flickr
#   2. nmt-train +experiment=multi30k: transformer_small at 192 dim, fairseq's standard
#      recipe (configs/experiment/multi30k.yaml), stopped after max_time=1.0 hour
#   3. nmt-average: average the last AVG numbered checkpoints (the final weights and the
#      last epoch ends before them)
#   4. nmt-generate: translate test_2016_flickr with beam BEAM, length penalty LENPEN
#   5. nmt-score: sacrebleu BLEU, cased, detokenized, 13a, printed with its signature
#   6. the same model translates and scores test_2016_flickr the other way (BOTH_WAYS)
#
# usage (from the repository root):
#   scripts/multi30k_recipe.sh                         # the full one-hour run: one model for
#                                                      # both directions, test BLEU en-de and de-en
#   BOTH_WAYS=0 scripts/multi30k_recipe.sh             # an en-de model alone
#   BOTH_WAYS=0 DIRECTION=de-en scripts/multi30k_recipe.sh   # a de-en model alone
#   SMOKE=1 scripts/multi30k_recipe.sh                 # the whole pipeline in a few minutes
#   scripts/multi30k_recipe.sh optim.lr=7e-4           # extra arguments go to nmt-train
#
# Environment (all optional):
#   DIRECTION  en-de (default), de-en, or any src-tgt pair RAW has files for (en-fr, de-fr):
#              the direction validated on and scored first
#   RAW        folder with train.{en,de} val.{en,de} test_2016_flickr.{en,de} (and .fr for
#              the French directions)
#              (default ../shared/data/multi30k); to fetch the public Multi30k task 1 files:
#                mkdir -p multi30k && cd multi30k && for f in train val test_2016_flickr; do
#                  for l in en de; do curl -fsSL -o $f.$l.gz \
#                    https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/$f.$l.gz
#                  gunzip -f $f.$l.gz; done; done
#   WORK       where data-bin/ and runs/ go (default work/multi30k, or work/multi30k_smoke)
#   SMOKE      1: SMOKE_UPDATES updates (default 60), a checkpoint every SMOKE_UPDATES/3,
#              100 test sentences, output length capped near the source's
#   AVG        checkpoints to average (default 3, chosen on val: docs/results.md)
#   BEAM       beam size (default 5)      LENPEN  length penalty (default 1.6, chosen on val)
#   BOTH_WAYS  1 (default): train one model on the pairs of both directions (each pair twice,
#              once each way; the joint vocabulary and shared embeddings make that one model),
#              validated on DIRECTION's val, and score it on test_2016_flickr both ways; it won
#              on val in both directions (docs/results.md, "Both directions in one model").
#              0: a model for DIRECTION alone
#   VOCAB      joint SentencePiece vocabulary size (default 8000); a data dir already in WORK
#              keeps the size it was built with, so give each size its own WORK
#   PYTHON     the interpreter with nmt installed (default .venv/bin/python if present)
# Re-running the same command reuses the data dir and resumes training from
# checkpoint_last.pt (a finished run stops at once), so an interrupted recipe loses nothing.
set -euo pipefail

SCRIPT=multi30k_recipe
source "$(dirname "$0")/multi30k_env.sh"  # DIRECTION -> SRC, TGT; RAW, PYTHON, nmt()
SMOKE=${SMOKE:-0}
if [ "$SMOKE" = 1 ]; then WORK=${WORK:-work/multi30k_smoke}; else WORK=${WORK:-work/multi30k}; fi
AVG=${AVG:-3}
VOCAB=${VOCAB:-8000}
case "$VOCAB" in
  '' | *[!0-9]* | 0*) echo "multi30k_recipe: error: VOCAB=$VOCAB: give a positive whole number" >&2; exit 2 ;;
esac
BOTH_WAYS=${BOTH_WAYS:-1}
case "$BOTH_WAYS" in
  0 | 1) ;;
  *) echo "multi30k_recipe: error: BOTH_WAYS=$BOTH_WAYS: use 1 (both directions) or 0" >&2; exit 2 ;;
esac
BEAM=${BEAM:-5}
# 1.6: on val it gained 0.6 BLEU de-en (42.1 -> 42.7) and 0.3 en-de (39.6 -> 39.9) over 1.0
# with the 192-dim model (docs/results.md, "Length penalty")
LENPEN=${LENPEN:-1.6}
TEST=test_2016_flickr
NAME=${SRC}_${TGT}  # en_de, or en_de_both for BOTH_WAYS
if [ "$BOTH_WAYS" = 1 ]; then NAME=${NAME}_both; fi
DATA="$WORK/data-bin/$NAME"
RUN="$WORK/runs/$NAME"
say() { echo "== multi30k_recipe [$DIRECTION$([ "$SMOKE" = 1 ] && echo ', SMOKE')]: $*" >&2; }

for split in train val $TEST; do
  for lang in $SRC $TGT; do
    if [ ! -s "$RAW/$split.$lang" ]; then
      echo "multi30k_recipe: error: $RAW/$split.$lang: missing; set RAW to the Multi30k task 1" \
           "raw folder (see the download commands at the top of $0)" >&2
      exit 2
    fi
  done
done
mkdir -p "$WORK"

# 1. Preprocess (skipped when the data dir is complete: meta.json is written last).
if [ -f "$DATA/meta.json" ]; then
  built=$("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["tgt_vocab_size"])' "$DATA/meta.json")
  if [ "$built" != "$VOCAB" ]; then
    echo "multi30k_recipe: error: $DATA was built with spm.vocab_size=$built, not VOCAB=$VOCAB;" \
         "set WORK to another folder for this size" >&2
    exit 2
  fi
  say "data dir $DATA exists, reusing it"
else
  TRAIN="$RAW/train"
  if [ "$BOTH_WAYS" = 1 ]; then  # each pair once each way: train.$SRC holds both languages
    TRAIN="$WORK/raw_both/train"
    mkdir -p "$WORK/raw_both"
    cat "$RAW/train.$SRC" "$RAW/train.$TGT" > "$TRAIN.$SRC"
    cat "$RAW/train.$TGT" "$RAW/train.$SRC" > "$TRAIN.$TGT"
  fi
  say "preprocessing $TRAIN, $RAW/val and $RAW/$TEST into $DATA"
  nmt preprocess data.src=$SRC data.tgt=$TGT data.trainpref="$TRAIN" \
    data.validpref="$RAW/val" "data.testpref=[$RAW/$TEST]" data.dest="$DATA" \
    spm.joint=true spm.model_type=unigram spm.vocab_size=$VOCAB
fi

# 2. Train. SMOKE keeps the recipe's model and optimizer, and only shortens the run.
SMOKE_ARGS=()
if [ "$SMOKE" = 1 ]; then
  smoke_train_args "${SMOKE_UPDATES:-60}" "$AVG"
fi
say "training into $RUN"
start=$(date +%s)
nmt train +experiment=multi30k data="$DATA" save_dir="$RUN" \
  ${SMOKE_ARGS[@]+"${SMOKE_ARGS[@]}"} "$@"
say "training took $(( $(date +%s) - start )) s (this invocation)"

# 3. Average the newest AVG numbered checkpoints.
AVG_CKPT="$RUN/checkpoint_avg_last$AVG.pt"
nmt average inputs="$RUN" num_last="$AVG" output="$AVG_CKPT"

# 4. Translate the test set. SMOKE: the first 100 sentences, output capped near the source
#    length (a barely trained model rarely stops by itself).
SRC_FILE="$RAW/$TEST.$SRC"
REF_FILE="$RAW/$TEST.$TGT"
GEN_ARGS=()
if [ "$SMOKE" = 1 ]; then
  head -n 100 "$SRC_FILE" > "$RUN/$TEST.100.$SRC"
  head -n 100 "$REF_FILE" > "$RUN/$TEST.100.$TGT"
  SRC_FILE="$RUN/$TEST.100.$SRC"
  REF_FILE="$RUN/$TEST.100.$TGT"
  GEN_ARGS=(max_len_a=1.2 max_len_b=10)
fi
HYP="$RUN/$TEST.hyp.$TGT"
say "translating $SRC_FILE with $AVG_CKPT (beam $BEAM, lenpen $LENPEN)"
nmt generate checkpoint="$AVG_CKPT" input="$SRC_FILE" output="$HYP" beam=$BEAM lenpen=$LENPEN \
  device=cpu threads=2 progress=false ${GEN_ARGS[@]+"${GEN_ARGS[@]}"}

# 5. Score: sacrebleu's defaults are cased, 13a-tokenized, on detokenized text (what we wrote).
say "valid curve (update, epoch, valid loss) from $RUN/train.jsonl"
"$PYTHON" - "$RUN/train.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1], encoding="utf-8"):
    e = json.loads(line)
    if e.get("type") == "valid":
        print(f"  update {e['update']:>6}  epoch {e['epoch']:>3}  valid loss {e.get('loss', float('nan')):.3f}",
              file=sys.stderr)
PY
say "BLEU of $HYP against $REF_FILE"
nmt score hyp="$HYP" refs="$REF_FILE" metrics=[bleu]

# 6. BOTH_WAYS: the same model translates the other way (its source is the reference above).
if [ "$BOTH_WAYS" = 1 ]; then
  BACK="$RUN/$TEST.hyp.$SRC"
  say "translating $REF_FILE the other way ($TGT-$SRC) with the same model"
  nmt generate checkpoint="$AVG_CKPT" input="$REF_FILE" output="$BACK" beam=$BEAM lenpen=$LENPEN \
    device=cpu threads=2 progress=false ${GEN_ARGS[@]+"${GEN_ARGS[@]}"}
  say "BLEU of $BACK against $SRC_FILE"
  nmt score hyp="$BACK" refs="$SRC_FILE" metrics=[bleu]
fi
