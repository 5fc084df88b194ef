"""The commands, one thin module each: `run(cfg) -> exit code` makes one library call and
prints its report. `nmt.config.COMMANDS` lists them; `nmt.cli` composes their configs.

preprocess.py      nmt-preprocess: parallel text -> data dir (nmt.data)
train.py           nmt-train: train on a data dir (nmt.training)
sweep.py           nmt-train -m: a sweep's runs one after another, and their table
average.py         nmt-average: average checkpoints' weights (nmt.training.averaging)
generate.py        nmt-generate: translate or score text (nmt.generation.job)
score.py           nmt-score: BLEU, chrF, TER of hypotheses (nmt.scoring)
shortlist.py       nmt-shortlist: a target-vocabulary shortlist (nmt.data.lexical)
export.py          nmt-export: a checkpoint -> CTranslate2 (nmt.interop)
import_fairseq.py  nmt-import-fairseq: a fairseq checkpoint -> nmt (nmt.interop)
serve.py           nmt-serve: translation over HTTP (nmt.serving)
"""
