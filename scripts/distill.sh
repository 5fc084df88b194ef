#!/usr/bin/env bash
# Sequence-level knowledge distillation on Multi30k en-de (Kim & Rush 2016), into a student
# with a deep encoder and a shallow decoder (Kasai et al. 2021, model=transformer_student):
#   1. the teacher: TEACHER=, or the Multi30k recipe's model, trained into WORK/teacher by
#      scripts/multi30k_recipe.sh
#   2. nmt-generate: the teacher translates the training sources (beam BEAM, lenpen LENPEN,
#      WORKERS processes): the distilled targets
#   3. nmt-preprocess: the reference pairs and the distilled pairs, both with one SentencePiece
#      model (the teacher's when it came from the recipe, else one trained on the references)
#   4. nmt-train +experiment=multi30k model=transformer_student, twice with the same budget
#      (max_time, the recipe's hour): on the distilled targets, and on the references;
#      nmt-average the last AVG checkpoints of each
#   5. nmt-generate + nmt-score: test_2016_flickr with the teacher (fp32) and each student
#      (fp32 and int8), 1 thread, beam BEAM: BLEU, and sentences/s from nmt-generate's own line
#   6. a table on stdout, and WORK/results.json
#
# usage (from the repository root):
#   scripts/distill.sh                          # the full run: the teacher's hour, two students' hours
#   TEACHER=runs/x/checkpoint_avg_last3.pt scripts/distill.sh   # distil an existing en-de model
#   SMOKE=1 scripts/distill.sh                  # the whole pipeline in a few minutes
#   scripts/distill.sh max_time=0.5             # extra arguments go to every nmt-train (teacher too)
#
# Environment (all optional):
#   RAW      folder with train.{en,de} val.{en,de} test_2016_flickr.{en,de}
#            (default ../shared/data/multi30k; download commands: scripts/multi30k_recipe.sh)
#   WORK     where everything goes (default work/distill, or work/distill_smoke)
#   TEACHER  an en-de checkpoint to distil (default: train the recipe's model into WORK/teacher;
#            BOTH_WAYS and VOCAB are passed on to the recipe)
#   SMOKE    1: the recipe's SMOKE teacher (its SMOKE_UPDATES, default 60), the first
#            SMOKE_LINES (default 500) training pairs, SMOKE_UPDATES (default 30) updates a
#            student, 100 test sentences, output capped near the source's length; the figures
#            only show that the pipeline runs
#   AVG      checkpoints to average (default 3)     BEAM  beam size (default 5)
#   LENPEN   length penalty (default 1.6, the recipe's)
#   WORKERS  nmt-generate processes for the training sources (default 2; SMOKE: 1)
#   PYTHON   the interpreter with nmt installed (default .venv/bin/python if present)
# Re-running the same command reuses every finished step (teacher, distilled targets, data
# dirs, translations) and resumes training and the teacher's translation where they stopped.
set -euo pipefail

SCRIPT=distill
DIRECTION=en-de  # the issue's experiment; the recipe's teacher is validated on en-de
source "$(dirname "$0")/multi30k_env.sh"  # SRC, TGT; RAW, PYTHON, nmt()
SMOKE=${SMOKE:-0}
if [ "$SMOKE" = 1 ]; then WORK=${WORK:-work/distill_smoke}; else WORK=${WORK:-work/distill}; fi
AVG=${AVG:-3}
BEAM=${BEAM:-5}
LENPEN=${LENPEN:-1.6}
WORKERS=${WORKERS:-$([ "$SMOKE" = 1 ] && echo 1 || echo 2)}
TEST=test_2016_flickr
say() { echo "== distill [$SRC-$TGT$([ "$SMOKE" = 1 ] && echo ', SMOKE')]: $*" >&2; }
fail() { echo "distill: error: $*" >&2; exit 2; }

for split in train val $TEST; do
  for lang in $SRC $TGT; do
    [ -s "$RAW/$split.$lang" ] || fail "$RAW/$split.$lang: missing; set RAW to the Multi30k" \
      "task 1 raw folder (download commands: scripts/multi30k_recipe.sh)"
  done
done
if [ -n "${TEACHER:-}" ] && [ ! -f "$TEACHER" ]; then
  fail "TEACHER=$TEACHER: no such checkpoint; give an en-de .pt file, or leave TEACHER unset" \
    "to train the Multi30k recipe's model"
fi
mkdir -p "$WORK"

# 1. The teacher. Its data dir's SentencePiece model becomes the students' (SPM).
SPM=
if [ -n "${TEACHER:-}" ]; then
  say "teacher: $TEACHER"
else
  name=${SRC}_${TGT}$([ "${BOTH_WAYS:-1}" = 1 ] && echo _both)  # the recipe's run name
  TEACHER="$WORK/teacher/runs/$name/checkpoint_avg_last$AVG.pt"
  SPM="$WORK/teacher/data-bin/$name/spm.model"
  if [ -f "$TEACHER" ]; then
    say "teacher $TEACHER exists, reusing it"
  else
    say "training the teacher with scripts/multi30k_recipe.sh into $WORK/teacher"
    WORK="$WORK/teacher" AVG=$AVG BEAM=$BEAM LENPEN=$LENPEN SMOKE=$SMOKE PYTHON="$PYTHON" \
      RAW="$RAW" DIRECTION=$DIRECTION bash "$(dirname "$0")/multi30k_recipe.sh" "$@"
  fi
fi

# The training pairs to distil (SMOKE: the first SMOKE_LINES), and the test sources.
RAW_REF="$WORK/raw_ref"
mkdir -p "$RAW_REF" "$WORK/raw_distilled"
if [ "$SMOKE" = 1 ]; then
  for lang in $SRC $TGT; do
    head -n "${SMOKE_LINES:-500}" "$RAW/train.$lang" > "$RAW_REF/train.$lang"
    head -n 100 "$RAW/$TEST.$lang" > "$RAW_REF/$TEST.$lang"
  done
else
  for lang in $SRC $TGT; do
    ln -sf "$(realpath "$RAW/train.$lang")" "$RAW_REF/train.$lang"
    ln -sf "$(realpath "$RAW/$TEST.$lang")" "$RAW_REF/$TEST.$lang"
  done
fi
GEN_ARGS=(beam=$BEAM lenpen=$LENPEN device=cpu progress=false)
# SMOKE: a barely trained model rarely stops by itself
if [ "$SMOKE" = 1 ]; then GEN_ARGS+=(max_len_a=1.2 max_len_b=10); fi

# 2. Distilled targets: the teacher's beam output for every training source. A killed run
#    resumes from its finished chunks (nmt-generate resume=true); a complete one is kept.
DISTILLED="$WORK/raw_distilled/train.$TGT"
lines() { wc -l < "$1"; }
if [ -f "$DISTILLED" ] && [ "$(lines "$DISTILLED")" = "$(lines "$RAW_REF/train.$SRC")" ]; then
  say "distilled targets $DISTILLED exist, reusing them"
else
  say "the teacher translates $(lines "$RAW_REF/train.$SRC") training sources ($WORKERS workers)"
  nmt generate checkpoint="$TEACHER" input="$RAW_REF/train.$SRC" output="$DISTILLED" \
    workers=$WORKERS "${GEN_ARGS[@]}"
fi
ln -sf "$(realpath "$RAW_REF/train.$SRC")" "$WORK/raw_distilled/train.$SRC"

# 3. Preprocess both training sets with one SentencePiece model, so that the two students
#    differ in their targets alone. With TEACHER= given, its tokenizer may be of any size or
#    separate per language; the students then get a joint model trained on the references.
preprocess() {  # data dir, training prefix, spm options...
  local dest=$1 train=$2
  shift 2
  if [ -f "$dest/meta.json" ]; then say "data dir $dest exists, reusing it"; return; fi
  say "preprocessing $train into $dest"
  nmt preprocess data.src=$SRC data.tgt=$TGT data.trainpref="$train" \
    data.validpref="$RAW/val" data.dest="$dest" "$@"
}
if [ -n "$SPM" ]; then
  preprocess "$WORK/data-bin/references" "$RAW_REF/train" spm.model="$SPM"
else
  preprocess "$WORK/data-bin/references" "$RAW_REF/train" \
    spm.joint=true spm.model_type=unigram spm.vocab_size=${VOCAB:-8000}
  SPM="$WORK/data-bin/references/spm.model"
fi
preprocess "$WORK/data-bin/distilled" "$WORK/raw_distilled/train" spm.model="$SPM"

# 4. The students: the recipe's run (schedule, batch, budget) with the student's depth.
SMOKE_ARGS=()
if [ "$SMOKE" = 1 ]; then smoke_train_args "${SMOKE_UPDATES:-30}" "$AVG"; fi
for data in distilled references; do
  run="$WORK/runs/student_$data"
  say "training the student on the $data pairs into $run"
  nmt train +experiment=multi30k model=transformer_student data="$WORK/data-bin/$data" \
    save_dir="$run" ${SMOKE_ARGS[@]+"${SMOKE_ARGS[@]}"} "$@"
  avg="$run/checkpoint_avg_last$AVG.pt"
  # averaged again only after more training (its translations below are then redone)
  if [ ! "$avg" -nt "$run/checkpoint_last.pt" ]; then
    nmt average inputs="$run" num_last="$AVG" output="$avg"
  fi
done

# 5. Score and time each model on the test set: 1 thread, beam BEAM; sentences/s is
#    nmt-generate's own figure (translation alone, the model already loaded).
EVAL="$WORK/eval"
mkdir -p "$EVAL"
evaluate() {  # name, checkpoint, precision
  local out="$EVAL/$1.$3" log="$EVAL/$1.$3.log"
  if [ "$out.json" -nt "$2" ]; then say "$out.json exists, reusing it"; return; fi
  say "translating $RAW_REF/$TEST.$SRC with $2 ($3, 1 thread)"
  nmt generate checkpoint="$2" input="$RAW_REF/$TEST.$SRC" output="$out.$TGT" threads=1 \
    precision="$3" "${GEN_ARGS[@]}" 2> "$log" || { cat "$log" >&2; exit 1; }
  cat "$log" >&2
  nmt score hyp="$out.$TGT" refs="$RAW_REF/$TEST.$TGT" metrics=[bleu] format=json \
    output="$out.bleu.json"
  "$PYTHON" - "$log" "$out.bleu.json" "$out.json" "$1" "$3" <<'PY'
import json, re, sys
log, bleu, out, model, precision = sys.argv[1:]
speed = re.search(r"^nmt-generate: translated (\d+) sentences .*: ([\d.]+) sentences/s", open(log).read(), re.M)
score = json.load(open(bleu))
row = {"model": model, "precision": precision, "bleu": score["scores"][0]["score"],
       "sentences": int(speed[1]), "sentences_per_s": float(speed[2]),
       "signature": score["scores"][0]["signature"]}
json.dump(row, open(out + ".tmp", "w"), indent=1)
PY
  mv "$out.json.tmp" "$out.json"
}
evaluate teacher "$TEACHER" fp32
for data in distilled references; do
  for precision in fp32 int8; do
    evaluate "student_$data" "$WORK/runs/student_$data/checkpoint_avg_last$AVG.pt" $precision
  done
done

# 6. The table and results.json.
"$PYTHON" - "$EVAL" "$WORK/results.json" "$TEACHER" "$BEAM" "$SMOKE" <<'PY'
import json, sys
from pathlib import Path
folder, out, teacher, beam, smoke = Path(sys.argv[1]), Path(sys.argv[2]), *sys.argv[3:]
names = ["teacher.fp32", *(f"student_{d}.{p}" for d in ("distilled", "references") for p in ("fp32", "int8"))]
rows = [json.loads((folder / f"{n}.json").read_text()) for n in names]
base = rows[0]["sentences_per_s"]
print(f"{'model':<20} {'precision':<9} {'BLEU':>6} {'sentences/s':>12} {'x teacher':>9}")
for r in rows:
    print(f"{r['model']:<20} {r['precision']:<9} {r['bleu']:>6.1f} {r['sentences_per_s']:>12.1f}"
          f" {r['sentences_per_s'] / base:>9.2f}")
print(f"(test_2016_flickr, 1 thread, beam {beam}; BLEU {rows[0]['signature']})")
if smoke == "1":  # barely trained models: outputs of arbitrary length, so are the speeds
    print("(SMOKE: 100 sentences, models of a few dozen updates: the figures mean nothing)")
results = {"teacher_checkpoint": teacher, "beam": int(beam), "smoke": smoke == "1",
           "signature": rows[0]["signature"],
           "models": {n: {k: r[k] for k in ("model", "precision", "bleu", "sentences", "sentences_per_s")}
                      for n, r in zip(names, rows)}}
tmp = out.with_suffix(".json.tmp")
tmp.write_text(json.dumps(results, indent=1) + "\n")
tmp.replace(out)
PY
say "wrote $WORK/results.json"
