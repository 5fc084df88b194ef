"""The Multi30k recipe: its experiment configs compose into the intended run, and (slow)
scripts/multi30k_recipe.sh runs end to end in SMOKE mode."""

from __future__ import annotations

import functools
import os
import re
import subprocess
from dataclasses import asdict
from pathlib import Path

import pytest

from nmt.cli import compose_config, to_dataclass
from nmt.model.config import ModelConfig
from nmt.model.transformer import Transformer

REPO = Path(__file__).resolve().parents[2]
EXPERIMENTS = REPO / "configs" / "experiment"
MULTI30K = REPO.parent / "shared" / "data" / "multi30k"
DEPRECATED_ALIASES = ["multi30k_en_de", "multi30k_de_en"]  # removed in 0.3.0


@functools.cache  # composing costs seconds; the configs are only read
def compose_train(*overrides: str):
    return to_dataclass(
        compose_config("train", ["data=/nonexistent/data", "save_dir=/nonexistent/run", *overrides])
    )


def test_experiment_composes_the_tuned_anchor_recipe():
    cfg = compose_train("+experiment=multi30k")
    small = asdict(compose_train("model=transformer_small").model)
    # transformer_small's depth and heads, narrowed for the hour (192 dim, FFN 4x), with the
    # recipe's regularisation and tying.
    changed = {
        "embed_dim": 192,
        "ffn_dim": 768,
        "dropout": 0.2,
        "attention_dropout": 0.0,
        "activation_dropout": 0.0,
        "share_all_embeddings": True,
    }
    assert asdict(cfg.model) == {**small, **changed}
    # fairseq's anchor schedule (inverse_sqrt, 1e-3, 1,000 warmup) retuned for the hour, as
    # shares of the hour: 24% of it warming up, the decay ending with it
    assert (cfg.optim.scheduler, cfg.optim.lr, cfg.optim.schedule_unit) == (
        "cosine",
        1.5e-3,
        "time",
    )
    assert (cfg.optim.warmup_fraction, cfg.optim.decay_fraction) == (0.24, 1.0)
    assert (cfg.optim.warmup_updates, cfg.optim.decay_updates, cfg.optim.min_lr) == (0, 0, 1e-5)
    assert cfg.optim.betas == [0.9, 0.98]
    # half fairseq's 4096 tokens a batch: on a 2-core CPU twice the updates won on val
    assert (cfg.loss.label_smoothing, cfg.max_tokens, cfg.update_freq) == (0.1, 2048, 1)
    assert cfg.max_time == 1.0 and cfg.max_update == 0 and cfg.max_epoch == 0
    assert (
        cfg.checkpoint.keep_last >= 5
    )  # the recipe averages the newest 3; the val sweep compares 3 and 5
    # bf16 where the CPU has it, fp32 where it would be emulated (nmt.runtime.native_bf16)
    assert cfg.precision == "auto" and cfg.device == "cpu"


@pytest.mark.parametrize("alias", DEPRECATED_ALIASES)
def test_the_old_per_direction_names_compose_the_one_run(alias):
    assert compose_train(f"+experiment={alias}") == compose_train("+experiment=multi30k")
    text = (EXPERIMENTS / f"{alias}.yaml").read_text()
    assert "Deprecated" in text and "removed in 0.3.0" in text


def test_command_line_overrides_win_over_the_experiment():
    cfg = compose_train(
        "+experiment=multi30k", "optim.lr=7e-4", "model.dropout=0.2", "max_time=0.5"
    )
    assert (cfg.optim.lr, cfg.model.dropout, cfg.max_time) == (7e-4, 0.2, 0.5)
    assert cfg.model.share_all_embeddings  # the rest of the experiment still applies


def test_experiment_builds_transformer_small_with_one_shared_embedding():
    cfg = compose_train("+experiment=multi30k")
    model = Transformer(cfg.model, 8000, 8000)
    assert model.encoder.embed_tokens.weight is model.decoder.embed_tokens.weight
    assert model.decoder.output_projection.weight is model.decoder.embed_tokens.weight
    untied = Transformer(
        ModelConfig(**{**asdict(cfg.model), "share_all_embeddings": False}), 8000, 8000
    )
    n_params = sum(p.numel() for p in model.parameters())
    # Tying removes exactly one 8000 x embed_dim matrix from the untied model.
    assert sum(p.numel() for p in untied.parameters()) - n_params == 8000 * cfg.model.embed_dim


@pytest.mark.parametrize("experiment", ["multi30k", *DEPRECATED_ALIASES])
def test_experiment_yaml_is_commented_line_by_line(experiment):
    text = (EXPERIMENTS / f"{experiment}.yaml").read_text()
    assert text.startswith("# @package _global_\n")
    keyed = [
        ln
        for ln in text.splitlines()
        if re.match(r"^\s*[\w\-/]+:\s*\S", ln) or ln.strip().startswith("- ")
    ]
    assert keyed and all("#" in ln for ln in keyed), [ln for ln in keyed if "#" not in ln]


@pytest.mark.slow
@pytest.mark.skipif(not (MULTI30K / "train.en").is_file(), reason="needs ../shared/data/multi30k")
@pytest.mark.parametrize("both_ways", [None, "0"])  # None: unset, the default (both ways)
def test_recipe_smoke_mode_runs_end_to_end(tmp_path, both_ways):
    env = {
        **{k: v for k, v in os.environ.items() if k != "BOTH_WAYS"},
        **({} if both_ways is None else {"BOTH_WAYS": both_ways}),
        "SMOKE": "1",
        "WORK": str(tmp_path),
        "RAW": str(MULTI30K),
        "PYTHON": str(REPO / ".venv" / "bin" / "python"),
    }
    proc = subprocess.run(
        ["bash", "scripts/multi30k_recipe.sh"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    both = both_ways is None
    run = tmp_path / "runs" / ("en_de_both" if both else "en_de")
    assert (run / "checkpoint_avg_last3.pt").is_file()
    directions = ["de", "en"] if both else ["de"]  # both ways: the model also translates de-en
    for tgt in directions:
        hyps = (run / f"test_2016_flickr.hyp.{tgt}").read_text(encoding="utf-8").splitlines()
        assert len(hyps) == 100
    # nmt-score prints sacrebleu's line: cased, 13a, with its signature (once per direction).
    scores = re.findall(
        r"BLEU\|nrefs:1\|case:mixed\|eff:no\|tok:13a\|smooth:exp\|version:\S+ = \d", proc.stdout
    )
    assert len(scores) == len(directions), proc.stdout
    assert "valid loss" in proc.stderr
    if both:  # trained on each pair once each way
        train = tmp_path / "raw_both" / "train"
        en, de = (MULTI30K / "train.en").read_bytes(), (MULTI30K / "train.de").read_bytes()
        assert (Path(f"{train}.en").read_bytes(), Path(f"{train}.de").read_bytes()) == (
            en + de,
            de + en,
        )


@pytest.mark.skipif(not (MULTI30K / "train.en").is_file(), reason="needs ../shared/data/multi30k")
def test_recipe_refuses_a_data_dir_built_with_another_vocab_size(tmp_path):
    # A data dir is reused when its meta.json exists; one built at another size must not be
    # trained on silently under the new VOCAB's name.
    data = tmp_path / "data-bin" / "en_de_both"  # the default run's: both ways
    data.mkdir(parents=True)
    (data / "meta.json").write_text('{"src_vocab_size": 8000, "tgt_vocab_size": 8000}')
    env = {**os.environ, "VOCAB": "4000", "WORK": str(tmp_path), "RAW": str(MULTI30K)}
    proc = subprocess.run(
        ["bash", "scripts/multi30k_recipe.sh"], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert f"{data} was built with spm.vocab_size=8000, not VOCAB=4000" in proc.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("value", ["2", "yes", "true"])
def test_recipe_rejects_a_bad_both_ways_in_one_line(tmp_path, value):
    env = {**os.environ, "BOTH_WAYS": value, "WORK": str(tmp_path)}
    proc = subprocess.run(
        ["bash", "scripts/multi30k_recipe.sh"], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert proc.stderr == (
        f"multi30k_recipe: error: BOTH_WAYS={value}: use 1 (both directions) or 0\n"
    )
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("vocab", ["abc", "0", "-5", "8k"])
def test_recipe_rejects_a_bad_vocab_size_in_one_line(tmp_path, vocab):
    env = {**os.environ, "VOCAB": vocab, "WORK": str(tmp_path)}
    proc = subprocess.run(
        ["bash", "scripts/multi30k_recipe.sh"], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert proc.stderr == f"multi30k_recipe: error: VOCAB={vocab}: give a positive whole number\n"
    assert not any(tmp_path.iterdir())
