#!/usr/bin/env bash
# Back-translation on half of Multi30k (Sennrich et al. 2016; tagged, Caswell et al. 2019):
#   1. split RAW's train: the first half stays parallel, the second half's target side alone
#      is the monolingual text
#   2. baseline: nmt-preprocess + nmt-train +experiment=multi30k on the half-parallel pairs,
#      averaged, scored on test_2016_flickr
#   3. reverse model (target -> source) on the same half; it translates the monolingual text
#      (nmt-generate, beam or sampling), and each synthetic source line gets the tag <BT>
#   4. forward model on real + synthetic pairs: one data dir (the synthetic pairs as split
#      "bt", <BT> reserved as one SentencePiece piece), trained with train_split={train:1,bt:W},
#      averaged, scored on the same test set
#   5. a table of both BLEU scores (sacreBLEU via nmt-score), and $WORK/results.json
#
# usage (from the repository root):
#   scripts/backtranslate.sh                         # the full run: 3 trainings of max_time
#                                                    # (1 hour each), ~14.5k sentences translated
#   SMOKE=1 scripts/backtranslate.sh                 # the whole pipeline in a few minutes
#   BT_SEARCH=sampling TAG=0 scripts/backtranslate.sh   # untagged sampled back-translation
#   scripts/backtranslate.sh optim.lr=7e-4           # extra arguments go to every nmt-train
#
# Environment (all optional):
#   DIRECTION  en-de (default), de-en, en-fr, ...: the forward direction (the monolingual text is its
#              target side)
#   RAW        folder with train.{en,de} val.{en,de} test_2016_flickr.{en,de}
#              (default ../shared/data/multi30k; download commands in multi30k_recipe.sh)
#   WORK       where everything goes (default work/backtranslate, or work/backtranslate_smoke)
#   SMOKE      1: SMOKE_UPDATES updates a model (default 60), SMOKE_MONO monolingual lines
#              translated (default 200), 100 test sentences, output length capped near the source's
#   BT_SEARCH  beam (default) or sampling (unrestricted, one sample a line, seed 1). Edunov et
#              al. 2018 found sampling better with millions of pairs, but beam better with a weak
#              reverse model trained on little data (their 80k-pair setting; here 14.5k pairs), and
#              Caswell et al. 2019 found tagged beam back-translation as good as noised/sampled
#   TAG        1 (default): "<BT> " starts every synthetic source line; 0: no tag
#   BT_WEIGHT  weight of the synthetic pairs in train_split (default 1: each pair once an epoch)
#   AVG        checkpoints to average (default 3)      BEAM, LENPEN  test and beam back-translation
#              search (default 5 and 1.6, the recipe's)     VOCAB  SentencePiece size (default 8000)
#   PYTHON     the interpreter with nmt installed (default .venv/bin/python if present)
# Re-running the same command reuses every finished step (split files, data dirs, trained runs,
# averages, translations) and resumes an interrupted training. A run that stopped by its own rule
# (max_time, max_update) is not trained again: delete its folder in $WORK/runs to retrain it.
# Runs and files are named by the settings that shape them, so other settings reuse the rest.
# A data dir is reused as it was built: delete it after changing what went into it (SMOKE_MONO,
# a retrained reverse model).
set -euo pipefail

SCRIPT=backtranslate
source "$(dirname "$0")/multi30k_env.sh"  # DIRECTION -> SRC, TGT; RAW, PYTHON, nmt()
SMOKE=${SMOKE:-0}
if [ "$SMOKE" = 1 ]; then WORK=${WORK:-work/backtranslate_smoke}; else WORK=${WORK:-work/backtranslate}; fi
BT_SEARCH=${BT_SEARCH:-beam}
TAG=${TAG:-1}
BT_WEIGHT=${BT_WEIGHT:-1}
AVG=${AVG:-3}
BEAM=${BEAM:-5}
LENPEN=${LENPEN:-1.6}
VOCAB=${VOCAB:-8000}
TEST=test_2016_flickr
BT_TAG="<BT>"
TRAIN_ARGS=("$@")

die() { echo "backtranslate: error: $*" >&2; exit 2; }
say() { echo "== backtranslate [$SRC-$TGT$([ "$SMOKE" = 1 ] && echo ', SMOKE')]: $*" >&2; }

check_settings() {
  case "$SMOKE" in 0 | 1) ;; *) die "SMOKE=$SMOKE: use 1 (a few minutes) or 0" ;; esac
  case "$BT_SEARCH" in beam | sampling) ;; *) die "BT_SEARCH=$BT_SEARCH: use beam or sampling" ;; esac
  case "$TAG" in 0 | 1) ;; *) die "TAG=$TAG: use 1 (tagged back-translation) or 0" ;; esac
  case "$VOCAB" in '' | *[!0-9]* | 0*) die "VOCAB=$VOCAB: give a positive whole number" ;; esac
  case "$AVG" in '' | *[!0-9]* | 0*) die "AVG=$AVG: give a positive whole number" ;; esac
  "$PYTHON" -c 'import sys; w = float(sys.argv[1]); sys.exit(not w > 0)' "$BT_WEIGHT" 2>/dev/null ||
    die "BT_WEIGHT=$BT_WEIGHT: give a positive number (1: each synthetic pair once an epoch)"
}

check_raw() {
  local split lang
  for split in train val $TEST; do
    for lang in $SRC $TGT; do
      [ -s "$RAW/$split.$lang" ] ||
        die "$RAW/$split.$lang: missing; set RAW to the Multi30k task 1 raw folder (see the download commands in scripts/multi30k_recipe.sh)"
    done
  done
  local n_src n_tgt
  n_src=$(wc -l < "$RAW/train.$SRC")
  n_tgt=$(wc -l < "$RAW/train.$TGT")
  [ "$n_src" = "$n_tgt" ] ||
    die "$RAW/train.$SRC has $n_src lines but $RAW/train.$TGT has $n_tgt; give line-aligned files"
  [ "$n_src" -ge 2 ] || die "$RAW/train.$SRC: $n_src line(s); at least 2 are needed to split in halves"
}

# write_once FILE CMD...: CMD's stdout into FILE unless FILE exists (atomically: never half a file)
write_once() {
  local file=$1; shift
  [ -f "$file" ] && return 0
  "$@" > "$file.tmp"
  mv "$file.tmp" "$file"
}

# 1. The first half of train, parallel; the second half's target side, monolingual.
split_train() {
  local n half
  n=$(wc -l < "$RAW/train.$SRC")
  half=$(( n / 2 ))
  mkdir -p "$WORK/text"
  write_once "$WORK/text/half.$SRC" head -n "$half" "$RAW/train.$SRC"
  write_once "$WORK/text/half.$TGT" head -n "$half" "$RAW/train.$TGT"
  write_once "$WORK/text/mono.$TGT" tail -n +$(( half + 1 )) "$RAW/train.$TGT"
  MONO="$WORK/text/mono.$TGT"
  if [ "$SMOKE" = 1 ]; then
    local first=${SMOKE_MONO:-200}
    write_once "$WORK/text/mono.first$first.$TGT" head -n "$first" "$MONO"
    MONO="$WORK/text/mono.first$first.$TGT"
  fi
  say "$half parallel pairs in $WORK/text/half.{$SRC,$TGT}, $(wc -l < "$MONO") monolingual lines in $MONO"
}

# preprocess DEST ARGS...: nmt-preprocess into DEST unless it is complete (meta.json is written
# last) and of VOCAB pieces
preprocess() {
  local dest=$1; shift
  if [ -f "$dest/meta.json" ]; then
    local built
    built=$("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["tgt_vocab_size"])' "$dest/meta.json")
    [ "$built" = "$VOCAB" ] ||
      die "$dest was built with spm.vocab_size=$built, not VOCAB=$VOCAB; set WORK to another folder for this size"
    say "data dir $dest exists, reusing it"
    return
  fi
  say "preprocessing into $dest"
  nmt preprocess data.dest="$dest" data.validpref="$RAW/val" "$@"
}

# train DATA RUN [ARGS...]: nmt-train +experiment=multi30k, resumed if interrupted, skipped when
# its last stop was its own rule's (a signal's stop resumes)
train() {
  local data=$1 run=$2; shift 2
  if [ -f "$run/checkpoint_last.pt" ] && "$PYTHON" - "$run/train.jsonl" <<'PY'
import json, os, sys
log = sys.argv[1]
events = map(json.loads, open(log, encoding="utf-8")) if os.path.exists(log) else []
stops = [e for e in events if e.get("type") == "stop"]
sys.exit(0 if stops and stops[-1].get("reason") != "signal" else 1)
PY
  then
    say "run $run finished, reusing it"
  else
    say "training into $run"
    nmt train +experiment=multi30k data="$data" save_dir="$run" "$@" \
      ${SMOKE_ARGS[@]+"${SMOKE_ARGS[@]}"} ${TRAIN_ARGS[@]+"${TRAIN_ARGS[@]}"}
  fi
  # the newest AVG numbered checkpoints, averaged again only when the run has changed since
  AVG_CKPT="$run/checkpoint_avg_last$AVG.pt"
  if [ ! "$AVG_CKPT" -nt "$run/checkpoint_last.pt" ]; then
    nmt average inputs="$run" num_last="$AVG" output="$AVG_CKPT"
  fi
}

# translate CKPT INPUT OUTPUT ARGS...: nmt-generate, unless OUTPUT is newer than CKPT and INPUT
translate() {
  local ckpt=$1 input=$2 output=$3; shift 3
  if [ "$output" -nt "$ckpt" ] && [ "$output" -nt "$input" ]; then
    say "$output is up to date, reusing it"; return
  fi
  say "translating $input with $ckpt into $output"
  nmt generate checkpoint="$ckpt" input="$input" output="$output" device=cpu progress=false \
    ${GEN_ARGS[@]+"${GEN_ARGS[@]}"} "$@"
}

# score HYP REF JSON: sacreBLEU's line on stdout, the report in JSON
score() {
  nmt score hyp="$1" refs="$2" metrics=[bleu] format=json output="$3"
  "$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["scores"][0]["line"])' "$3"
}

# forward_test RUN: translate and score the test set with RUN's average (sets AVG_CKPT's hyp)
forward_test() {
  local run=$1
  translate "$AVG_CKPT" "$TEST_SRC" "$run/$TEST.hyp.$TGT" beam="$BEAM" lenpen="$LENPEN" threads=2
  say "BLEU of $run/$TEST.hyp.$TGT against $TEST_REF"
  score "$run/$TEST.hyp.$TGT" "$TEST_REF" "$run/$TEST.bleu.json"
}

# 3b. Synthetic pairs: the tagged back-translations and the monolingual lines they came from.
#     A line translated to nothing is dropped (its pair would teach nothing).
make_synthetic_pairs() {
  local hyp=$1 out=$2
  if [ "$out.$SRC" -nt "$hyp" ] && [ "$out.$TGT" -nt "$hyp" ]; then return; fi
  local prefix=""
  if [ "$TAG" = 1 ]; then prefix="$BT_TAG "; fi
  "$PYTHON" - "$hyp" "$MONO" "$out" "$SRC" "$TGT" "$prefix" <<'PY'
import os, sys
hyp, mono, out, src, tgt, tag = sys.argv[1:]
with open(hyp, encoding="utf-8") as h, open(mono, encoding="utf-8") as m:
    pairs = [(s.strip(), t.rstrip("\n")) for s, t in zip(h, m, strict=True)]
kept = [(tag + s, t) for s, t in pairs if s]
for lang, side in ((src, 0), (tgt, 1)):
    with open(f"{out}.{lang}.tmp", "w", encoding="utf-8") as f:
        f.writelines(pair[side] + "\n" for pair in kept)
    os.replace(f"{out}.{lang}.tmp", f"{out}.{lang}")
dropped = len(pairs) - len(kept)
print(f"== backtranslate: {len(kept)} synthetic pairs in {out}.{{{src},{tgt}}}"
      + (f" ({dropped} empty translations dropped)" if dropped else ""), file=sys.stderr)
PY
}

write_results() {
  "$PYTHON" - "$WORK/results.json" "$BASE_RUN/$TEST.bleu.json" "$BT_RUN/$TEST.bleu.json" \
    "$SRC-$TGT" "$SMOKE" "$BT_SEARCH" "$TAG" "$BT_WEIGHT" "$AVG" "$BEAM" "$LENPEN" "$VOCAB" \
    "$(wc -l < "$WORK/text/half.$SRC")" "$(wc -l < "$MONO")" "$(wc -l < "$SYN.$SRC")" \
    "$(wc -l < "$TEST_SRC")" ${TRAIN_ARGS[@]+"${TRAIN_ARGS[@]}"} <<'PY'
import json, os, sys
out, base, bt, direction, smoke, search, tag, weight, avg, beam, lenpen, vocab = sys.argv[1:13]
parallel, mono, synthetic, test_lines = map(int, sys.argv[13:17])
base_bleu, bt_bleu = (json.load(open(p))["scores"][0] for p in (base, bt))
results = {
    "direction": direction,
    "test": "test_2016_flickr",
    "test_lines": test_lines,
    "smoke": smoke == "1",
    "baseline_bleu": base_bleu["score"],
    "backtranslation_bleu": bt_bleu["score"],
    "gain": round(bt_bleu["score"] - base_bleu["score"], 2),
    "signature": bt_bleu["signature"],
    "settings": {
        "bt_search": search,
        "tag": tag == "1",
        "bt_weight": float(weight),
        "avg": int(avg),
        "beam": int(beam),
        "lenpen": float(lenpen),
        "vocab": int(vocab),
        "train_args": sys.argv[17:],
    },
    "parallel_pairs": parallel,
    "monolingual_lines": mono,
    "synthetic_pairs": synthetic,
}
with open(out + ".tmp", "w", encoding="utf-8") as f:
    json.dump(results, f, indent=1)
    f.write("\n")
os.replace(out + ".tmp", out)
print(f"{'system':<28} {'test BLEU':>9}")
print(f"{'baseline (half parallel)':<28} {base_bleu['score']:>9.1f}")
print(f"{'+ back-translation':<28} {bt_bleu['score']:>9.1f}")
print(f"{'gain':<28} {results['gain']:>+9.1f}")
PY
  say "wrote $WORK/results.json"
}

check_settings
check_raw
mkdir -p "$WORK"

# SMOKE keeps the recipe's model and optimizer, and only shortens the runs and the outputs.
SMOKE_ARGS=()
GEN_ARGS=()
TEST_SRC="$RAW/$TEST.$SRC"
TEST_REF="$RAW/$TEST.$TGT"
if [ "$SMOKE" = 1 ]; then
  smoke_train_args "${SMOKE_UPDATES:-60}" "$AVG"
  GEN_ARGS=(max_len_a=1.2 max_len_b=10)  # a barely trained model rarely stops by itself
  mkdir -p "$WORK/text"
  write_once "$WORK/text/$TEST.100.$SRC" head -n 100 "$TEST_SRC"
  write_once "$WORK/text/$TEST.100.$TGT" head -n 100 "$TEST_REF"
  TEST_SRC="$WORK/text/$TEST.100.$SRC"
  TEST_REF="$WORK/text/$TEST.100.$TGT"
fi

# 1. Split.
split_train

# 2. Baseline: the forward model on the half-parallel pairs (its SentencePiece model serves the
#    reverse model too).
BASE_DATA="$WORK/data-bin/${SRC}_${TGT}"
BASE_RUN="$WORK/runs/${SRC}_${TGT}"
preprocess "$BASE_DATA" data.src=$SRC data.tgt=$TGT data.trainpref="$WORK/text/half" \
  spm.joint=true spm.model_type=unigram spm.vocab_size=$VOCAB
train "$BASE_DATA" "$BASE_RUN"
forward_test "$BASE_RUN"

# 3. Reverse model on the same pairs; it back-translates the monolingual text.
REV_DATA="$WORK/data-bin/${TGT}_${SRC}"
REV_RUN="$WORK/runs/${TGT}_${SRC}"
preprocess "$REV_DATA" data.src=$TGT data.tgt=$SRC data.trainpref="$WORK/text/half" \
  spm.model="$BASE_DATA/spm.model"
train "$REV_DATA" "$REV_RUN"
if [ "$BT_SEARCH" = sampling ]; then
  SEARCH_ARGS=(sampling=true beam=1 seed=1)  # one unrestricted sample a line
else
  SEARCH_ARGS=(beam="$BEAM" lenpen="$LENPEN")
fi
if [ "$SMOKE" = 1 ]; then SEARCH_ARGS+=(threads=2); else SEARCH_ARGS+=(workers=2 threads=1); fi
BT_HYP="$WORK/text/$(basename "$MONO" ".$TGT").$BT_SEARCH.$SRC"
translate "$AVG_CKPT" "$MONO" "$BT_HYP" "${SEARCH_ARGS[@]}"
SUFFIX=$BT_SEARCH
if [ "$TAG" = 1 ]; then SUFFIX=${BT_SEARCH}_tag; fi
SYN="$WORK/text/synthetic.$SUFFIX"
make_synthetic_pairs "$BT_HYP" "$SYN"

# 4. Forward model on real + synthetic pairs, in one data dir (split "bt").
BT_DATA="$WORK/data-bin/${SRC}_${TGT}_bt_$SUFFIX"
BT_RUN="$WORK/runs/${SRC}_${TGT}_bt_${SUFFIX}_w$BT_WEIGHT"
SYMBOLS=()
if [ "$TAG" = 1 ]; then SYMBOLS=("spm.user_defined_symbols=['$BT_TAG']"); fi  # one piece, never split
preprocess "$BT_DATA" data.src=$SRC data.tgt=$TGT data.trainpref="$WORK/text/half" \
  "+data.extra_train.bt=$SYN" spm.joint=true spm.model_type=unigram \
  spm.vocab_size=$VOCAB ${SYMBOLS[@]+"${SYMBOLS[@]}"}
train "$BT_DATA" "$BT_RUN" "train_split={train:1,bt:$BT_WEIGHT}"
forward_test "$BT_RUN"

# 5. The table and results.json.
write_results
