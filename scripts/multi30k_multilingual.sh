#!/usr/bin/env bash
# One model for every direction among several languages of Multi30k (Johnson et al. 2017):
#   1. nmt-preprocess data.langs=[LANGS]: one joint unigram SentencePiece model (VOCAB pieces)
#      with a tag per language (<2en>, <2de>, ...), each pair binarized once and read both ways
#   2. nmt-train +experiment=multi30k on every direction (the target's tag starts the source;
#      directions sampled by size with TEMPERATURE), validated per direction, for max_time=2.0
#   3. nmt-average: the last AVG numbered checkpoints
#   4. for each direction: nmt-generate tgt_lang=<target> on test_2016_flickr, nmt-score
#      (sacreBLEU), and the share of outputs not identified as the target language (py3langid,
#      restricted to LANGS)
#   5. the table, and $WORK/results.json: {"checkpoint", "bleu": {"en-de": ...},
#      "off_target": {"en-de": ...}}
#
# usage (from the repository root):
#   scripts/multi30k_multilingual.sh                    # the full run: en, de, fr, 6 directions,
#                                                       # two hours of training
#   SMOKE=1 scripts/multi30k_multilingual.sh            # the whole pipeline in a few minutes
#   LANGS="en de" scripts/multi30k_multilingual.sh      # two languages, both ways
#   scripts/multi30k_multilingual.sh max_time=1.0       # extra arguments go to nmt-train
#
# Environment (all optional):
#   LANGS        the languages (default "en de fr"); RAW must hold train, val and
#                test_2016_flickr .<lang> for each; a new language needs only its files and code
#   RAW          the folder of those files (default ../shared/data/multi30k, which has en, de, fr)
#   WORK         where data-bin/, runs/ and results.json go (default work/multilingual, or
#                work/multilingual_smoke)
#   SMOKE        1: SMOKE_UPDATES updates (default 60), 100 test sentences a direction, output
#                length capped near the source's
#   TEMPERATURE  sampling temperature across directions (default 1: by size; Multi30k's
#                directions are the same size, so any value draws the same)
#   LANG_TAG     tgt (default), src_tgt or decoder: where the language tag goes
#   AVG          checkpoints to average (default 3)    BEAM, LENPEN  search (default 5, 1.6)
#   VOCAB        joint SentencePiece vocabulary size (default 8000)
#   PYTHON       the interpreter with nmt installed (default .venv/bin/python if present)
# Off-target needs py3langid: pip install 'nmt[langid]' (the test extra has it).
# Re-running the same command reuses the data dir and resumes training from
# checkpoint_last.pt (a finished run stops at once), so an interrupted recipe loses nothing.
set -euo pipefail

SCRIPT=multi30k_multilingual
source "$(dirname "$0")/multi30k_env.sh"  # RAW, PYTHON, nmt(), smoke_train_args
SMOKE=${SMOKE:-0}
if [ "$SMOKE" = 1 ]; then WORK=${WORK:-work/multilingual_smoke}; else WORK=${WORK:-work/multilingual}; fi
read -r -a LANG_LIST <<< "${LANGS:-en de fr}"
AVG=${AVG:-3}
BEAM=${BEAM:-5}
LENPEN=${LENPEN:-1.6}
VOCAB=${VOCAB:-8000}
TEMPERATURE=${TEMPERATURE:-1}
LANG_TAG=${LANG_TAG:-tgt}
TEST=test_2016_flickr
DATA="$WORK/data-bin/multilingual"
RUN="$WORK/runs/multilingual"
say() { echo "== $SCRIPT$([ "$SMOKE" = 1 ] && echo ' [SMOKE]'): $*" >&2; }
fail() { echo "$SCRIPT: error: $*" >&2; exit 2; }

if [ "${#LANG_LIST[@]}" -lt 2 ]; then fail "LANGS=${LANGS:-}: give two or more language codes"; fi
case "$VOCAB" in '' | *[!0-9]* | 0*) fail "VOCAB=$VOCAB: give a positive whole number" ;; esac
case "$LANG_TAG" in tgt | src_tgt | decoder) ;; *) fail "LANG_TAG=$LANG_TAG: use tgt, src_tgt or decoder" ;; esac
for lang in "${LANG_LIST[@]}"; do
  for split in train val $TEST; do
    if [ ! -s "$RAW/$split.$lang" ]; then
      fail "$RAW/$split.$lang: missing; every language of LANGS needs train, val and $TEST" \
           "files in RAW"
    fi
  done
done
mkdir -p "$WORK"
LANGS_LIST=$(IFS=,; echo "${LANG_LIST[*]}")

# 1. Preprocess (skipped when the data dir is complete: meta.json is written last).
if [ -f "$DATA/meta.json" ]; then
  built=$("$PYTHON" -c 'import json, sys; m = json.load(open(sys.argv[1])); print(",".join(m.get("langs", [])), m["tgt_vocab_size"])' "$DATA/meta.json")
  if [ "$built" != "$LANGS_LIST $VOCAB" ]; then
    fail "$DATA was built for languages and size '$built', not LANGS='${LANG_LIST[*]}' VOCAB=$VOCAB;" \
         "set WORK to another folder"
  fi
  say "data dir $DATA exists, reusing it"
else
  say "preprocessing ${LANG_LIST[*]} from $RAW into $DATA"
  nmt preprocess "data.langs=[$LANGS_LIST]" data.trainpref="$RAW/train" \
    data.validpref="$RAW/val" "data.testpref=[$RAW/$TEST]" data.dest="$DATA" \
    spm.joint=true spm.model_type=unigram spm.vocab_size=$VOCAB
fi

# 2. Train every direction. SMOKE keeps the recipe's model and optimizer, only shortens the run.
SMOKE_ARGS=()
if [ "$SMOKE" = 1 ]; then smoke_train_args "${SMOKE_UPDATES:-60}" "$AVG"; fi
say "training into $RUN"
start=$(date +%s)
nmt train +experiment=multi30k data="$DATA" save_dir="$RUN" max_time=2.0 \
  lang_tag=$LANG_TAG sampling_temperature=$TEMPERATURE ${SMOKE_ARGS[@]+"${SMOKE_ARGS[@]}"} "$@"
say "training took $(( $(date +%s) - start )) s (this invocation)"

# 3. Average the newest AVG numbered checkpoints.
AVG_CKPT="$RUN/checkpoint_avg_last$AVG.pt"
nmt average inputs="$RUN" num_last="$AVG" output="$AVG_CKPT"

# 4. Each direction: translate, score, identify the outputs' language.
GEN_ARGS=()
if [ "$SMOKE" = 1 ]; then GEN_ARGS=(max_len_a=1.2 max_len_b=10); fi
OUT="$RUN/$TEST"
mkdir -p "$OUT"
DIRECTIONS=()
for src in "${LANG_LIST[@]}"; do
  for tgt in "${LANG_LIST[@]}"; do
    if [ "$src" = "$tgt" ]; then continue; fi
    DIRECTIONS+=("$src-$tgt")
    SRC_FILE="$RAW/$TEST.$src"
    REF_FILE="$RAW/$TEST.$tgt"
    if [ "$SMOKE" = 1 ]; then
      head -n 100 "$SRC_FILE" > "$OUT/100.$src" && SRC_FILE="$OUT/100.$src"
      head -n 100 "$REF_FILE" > "$OUT/100.$tgt" && REF_FILE="$OUT/100.$tgt"
    fi
    HYP="$OUT/$src-$tgt.hyp"
    say "$src-$tgt: translating $SRC_FILE (beam $BEAM, lenpen $LENPEN)"
    nmt generate checkpoint="$AVG_CKPT" input="$SRC_FILE" output="$HYP" tgt_lang=$tgt \
      src_lang=$src beam=$BEAM lenpen=$LENPEN device=cpu threads=2 progress=false \
      ${GEN_ARGS[@]+"${GEN_ARGS[@]}"}
    nmt score hyp="$HYP" refs="$REF_FILE" metrics=[bleu] format=json output="$OUT/$src-$tgt.bleu.json"
  done
done

# 5. Off-target shares, the table and results.json.
"$PYTHON" - "$WORK/results.json" "$AVG_CKPT" "$OUT" "$LANGS_LIST" "${DIRECTIONS[@]}" <<'PY'
import json, os, sys

from nmt.data.cleaning import load_identifier

results_file, checkpoint, out, langs, *directions = sys.argv[1:]
identifier = load_identifier()
identifier.set_languages(langs.split(","))
bleu, off_target, lines = {}, {}, {}
for direction in directions:
    tgt = direction.split("-")[1]
    bleu[direction] = json.load(open(f"{out}/{direction}.bleu.json"))["scores"][0]["score"]
    hyps = [h.strip() for h in open(f"{out}/{direction}.hyp", encoding="utf-8")]
    wrong = sum(1 for h in hyps if h and identifier.classify(h)[0] != tgt)
    off_target[direction] = round(wrong / max(1, len(hyps)), 4)
    lines[direction] = len(hyps)
results = {
    "checkpoint": checkpoint,
    "bleu": bleu,
    "off_target": off_target,
    "test": "test_2016_flickr",
    "lines": lines,
}
with open(results_file + ".tmp", "w", encoding="utf-8") as f:
    json.dump(results, f, indent=2)
    f.write("\n")
os.replace(results_file + ".tmp", results_file)
print(f"{'direction':<10} {'BLEU':>6} {'off-target':>11}")
for direction in directions:
    print(f"{direction:<10} {bleu[direction]:>6.1f} {100 * off_target[direction]:>10.1f}%")
PY
say "wrote $WORK/results.json"
