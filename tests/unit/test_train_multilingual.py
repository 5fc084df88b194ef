"""nmt-train on a multilingual data dir: the language options, tags on every sentence a
batch sees, temperature sampling across directions, validation per direction, the
checkpoint's languages, and resume (bitwise, and refusing changed language options)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import assert_bitwise_equal, last_params, run_training, tiny_config
from helpers_multilingual import LANGS

from nmt.checkpoint import load_checkpoint
from nmt.data.languages import LanguageTags, tag_piece
from nmt.data.meta import load_meta, write_meta
from nmt.data.tokenizer import Tokenizer
from nmt.errors import NmtError
from nmt.training import build_training
from nmt.training.data import TrainData, load_train_data
from nmt.training.multilingual import temperature_factors
from nmt.training.validation import decode_for_validation
from nmt.vocab import EOS

# build_training(threads=1) sets torch's global thread count; the fixture restores it after each test.
pytestmark = pytest.mark.usefixtures("one_thread")

DIRECTIONS = ["en-de", "de-en", "en-fr", "fr-en", "de-fr", "fr-de"]


def multi_config(data_dir: Path, save_dir: Path, **overrides):
    """tiny_config on the multilingual data dir: its `train` split, validation off."""
    return tiny_config(data_dir, save_dir, **{"train_split": "train", **overrides})


def tag_ids(data_dir: Path) -> dict[str, int]:
    pieces = Tokenizer.from_file(data_dir / "spm.model").pieces()
    return {lang: pieces.index(tag_piece(lang)) for lang in LANGS}


def direction_of_rows(data: TrainData, rows: np.ndarray) -> list[str]:
    """The direction of each of `rows` (rows of data.train: the corpora end to end)."""
    corpus = np.searchsorted(data._offsets, rows, side="right") - 1
    return [data.corpora[int(c)].direction for c in corpus]


# ------------------------------------------------------------------ options


@pytest.mark.parametrize(
    "key, value",
    [
        ("lang_tag", "decoder"),
        ("directions", ["en-de"]),
        ("sampling_temperature", 5.0),
        ("validation", {"direction": "en-de"}),
    ],
)
def test_a_single_pair_data_dir_keeps_the_language_options_at_their_defaults(
    demo_data_dir, tmp_path, key, value
):
    cfg = tiny_config(demo_data_dir, tmp_path / "run", **{key: value})
    with pytest.raises(NmtError) as err:
        load_train_data(cfg)
    message = str(err.value)
    option = "validation.direction" if key == "validation" else key
    assert message.startswith(f"{option}=") and "holds one pair (en-de)" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    "overrides, start",
    [
        ({"lang_tag": "both"}, "lang_tag=both: unknown; use one of tgt, src_tgt, decoder"),
        ({"sampling_temperature": 0.0}, "sampling_temperature=0.0: must be positive"),
        ({"directions": ["en_de"]}, "directions=[en_de]: 'en_de' is not a direction"),
        ({"directions": ["en-de", "en-de"]}, "directions=[en-de,en-de]: names a direction twice"),
        ({"validation": {"direction": "de"}}, "validation.direction=de: not a direction"),
    ],
)
def test_bad_language_options_are_one_line_errors(tmp_path, overrides, start):
    cfg = tiny_config(tmp_path / "data", tmp_path / "run", **overrides)
    with pytest.raises(NmtError) as err:
        cfg.validate()
    assert str(err.value).startswith(start) and "\n" not in str(err.value)


def test_directions_and_validation_direction_must_be_the_data_dirs(multilingual_data_dir, tmp_path):
    with pytest.raises(NmtError, match=r"^directions=\[en-de,es-en\]: .* has no direction es-en"):
        load_train_data(
            multi_config(multilingual_data_dir, tmp_path, directions=["en-de", "es-en"])
        )
    cfg = multi_config(
        multilingual_data_dir,
        tmp_path,
        directions=["en-de", "de-en"],
        validation={"split": "valid", "direction": "en-fr"},
    )
    with pytest.raises(NmtError, match=r"^validation.direction=en-fr: not a direction this run"):
        load_train_data(cfg)


def test_splits_missing_for_a_direction_are_one_line_errors(multilingual_data_dir, tmp_path):
    with pytest.raises(NmtError, match=r"^train_split=test: .* has no split test.en-de, which en"):
        load_train_data(multi_config(multilingual_data_dir, tmp_path, train_split="test"))
    cfg = multi_config(multilingual_data_dir, tmp_path, validation={"split": "dev"})
    with pytest.raises(NmtError, match=r"^validation.split=dev: .* has no split dev.en-de \(it"):
        load_train_data(cfg)


def test_a_tag_missing_from_the_tokenizer_is_a_one_line_error(multilingual_data_dir, tmp_path):
    broken = tmp_path / "data"
    shutil.copytree(multilingual_data_dir, broken)
    meta = load_meta(broken)
    meta.lang_tags["fr"] = "<2fra>"
    write_meta(broken, meta)
    with pytest.raises(NmtError, match=r"spm.model: has no piece <2fra> \(the tag of fr in "):
        load_train_data(multi_config(broken, tmp_path / "run"))


# ------------------------------------------------------------------ tags


@pytest.mark.parametrize("style", ["tgt", "src_tgt", "decoder"])
def test_every_pair_carries_its_directions_tags_and_its_sizes_count_them(
    multilingual_data_dir, tmp_path, style
):
    data = load_train_data(multi_config(multilingual_data_dir, tmp_path, lang_tag=style))
    ids = tag_ids(multilingual_data_dir)
    untagged = load_train_data(multi_config(multilingual_data_dir, tmp_path))
    assert [c.direction for c in data.corpora] == DIRECTIONS
    rows = np.arange(len(data.train))
    for row, direction in zip(rows, direction_of_rows(data, rows)):
        src_lang, tgt_lang = direction.split("-")
        src, tgt = data.train[int(row)]
        want_src = {"tgt": [ids[tgt_lang]], "src_tgt": [ids[src_lang], ids[tgt_lang]]}
        want_tgt = [ids[tgt_lang]] if style == "decoder" else []
        prefix = want_src.get(style, [])
        assert src[: len(prefix)].tolist() == prefix and tgt[: len(want_tgt)].tolist() == want_tgt
        assert not set(src[len(prefix) :].tolist()) & set(ids.values())  # text never is a tag
        assert len(src) == data.train.src_sizes[row] and len(tgt) == data.train.tgt_sizes[row]
        assert src[-1] == tgt[-1] == EOS
    # the stored sentences, read in each direction's orientation (de-en: de is the source)
    tag_counts = {"tgt": (1, 0), "src_tgt": (2, 0), "decoder": (0, 1)}[style]
    assert (data.train.src_sizes == untagged.train.src_sizes - 1 + tag_counts[0]).all()
    assert (data.train.tgt_sizes == untagged.train.tgt_sizes + tag_counts[1]).all()
    # de-en reads en-de's stored pairs the other way round
    first_de_en = int(data._offsets[1])
    de_source = data.train[first_de_en][0][tag_counts[0] :]
    de_target = data.train[0][1][tag_counts[1] :]
    assert de_source.tolist() == de_target.tolist()


def test_prefixed_lengths_grow_into_a_wider_dtype_when_they_must(tmp_path):
    from nmt.data.binarize import TokenArray, TokenArrayWriter
    from nmt.data.dataset import PrefixedSequences

    writer = TokenArrayWriter(tmp_path / "side", np.dtype(np.uint16))
    writer.add(np.full(255 + 3, 9), np.array([255, 3]))
    writer.close()
    seqs = PrefixedSequences(TokenArray(str(tmp_path / "side")), [5, 6])
    assert seqs.lengths().tolist() == [257, 5] and seqs.sizes.tolist() == [257, 5]
    assert seqs[1].tolist() == [5, 6, 9, 9, 9]


@pytest.mark.parametrize("style", ["src_tgt", "decoder"])
def test_subword_sampling_keeps_the_tags(multilingual_data_dir, tmp_path, style):
    cfg = multi_config(
        multilingual_data_dir,
        tmp_path,
        lang_tag=style,
        subword={"src_alpha": 0.2, "tgt_alpha": 0.2},
    )
    data = load_train_data(cfg)
    ids = tag_ids(multilingual_data_dir)
    batches = data.epoch_batches(1)
    resegmented = 0
    for b in range(len(batches)):
        rows = batches[b]
        stored = data.train.pairs(rows)
        drawn = data.train_pairs(rows, epoch=1)
        for direction, (src, tgt), (src0, tgt0) in zip(
            direction_of_rows(data, rows), drawn, stored
        ):
            src_lang, tgt_lang = direction.split("-")
            prefix = [ids[src_lang], ids[tgt_lang]] if style == "src_tgt" else []
            target = [ids[tgt_lang]] if style == "decoder" else []
            assert src[: len(prefix)].tolist() == prefix and tgt[: len(target)].tolist() == target
            assert not set(src[len(prefix) :].tolist()) & set(ids.values())
            resegmented += src.tolist() != src0.tolist() or tgt.tolist() != tgt0.tolist()
    assert resegmented > len(data.train) // 4  # the sampling did sample


# ------------------------------------------------------------------ temperature


@pytest.mark.parametrize("temperature", [1.0, 2.0, 5.0, 100.0])
def test_each_epoch_draws_each_direction_as_the_temperature_formula_says(
    multilingual_data_dir, tmp_path, temperature
):
    data = load_train_data(
        multi_config(multilingual_data_dir, tmp_path, sampling_temperature=temperature)
    )
    meta = load_meta(multilingual_data_dir)
    sizes = {d: meta.splits[meta.direction_split("train", d)[0]].kept for d in DIRECTIONS}
    total = sum(sizes.values())
    powered = {d: n ** (1 / temperature) for d, n in sizes.items()}
    expected = {d: round(powered[d] / sum(powered.values()) * total) for d in DIRECTIONS}
    drawn_rows = []
    for epoch in (1, 2, 3):
        rows = np.concatenate(list(data.epoch_batches(epoch)))
        counts = dict.fromkeys(DIRECTIONS, 0)
        for d in direction_of_rows(data, rows):
            counts[d] += 1
        assert counts == expected, epoch
        drawn_rows.append(np.sort(rows))
    if temperature == 1.0:
        assert all(count == sizes[d] for d, count in expected.items())
    else:  # fractions of a corpus are drawn anew each epoch, from (seed, epoch)
        assert not np.array_equal(drawn_rows[0], drawn_rows[1])
        again = load_train_data(
            multi_config(multilingual_data_dir, tmp_path, sampling_temperature=temperature)
        )
        assert np.array_equal(np.sort(np.concatenate(list(again.epoch_batches(2)))), drawn_rows[1])
    assert any("sampling_temperature" in note for note in data.notes)


def test_temperature_factors_keep_the_total_and_go_uniform():
    sizes = {"a": 1000, "b": 100, "c": 10}
    assert temperature_factors(sizes, 1.0) == {"a": 1.0, "b": 1.0, "c": 1.0}
    for t in (0.5, 2.0, 5.0, 1e6):
        factors = temperature_factors(sizes, t)
        taken = {d: factors[d] * n for d, n in sizes.items()}
        assert sum(taken.values()) == pytest.approx(1110)
        assert taken["a"] / taken["b"] == pytest.approx(10 ** (1 / t))
        assert taken["b"] / taken["c"] == pytest.approx(10 ** (1 / t))
    uniform = temperature_factors(sizes, 1e6)
    assert all(uniform[d] * n == pytest.approx(370, rel=1e-3) for d, n in sizes.items())


# ------------------------------------------------------------------ validation, checkpoint


def test_validation_per_direction_logs_each_direction_and_their_mean(
    multilingual_data_dir, tmp_path
):
    cfg = multi_config(
        multilingual_data_dir,
        tmp_path / "run",
        lang_tag="decoder",
        max_update=3,
        validation={"split": "valid", "bleu": {"enabled": True, "max_sentences": 4, "len_b": 3}},
        logging={"tensorboard": True},
    )
    run_training(cfg)
    events = [json.loads(line) for line in (tmp_path / "run" / "train.jsonl").open()]
    (valid,) = [e for e in events if e["type"] == "valid"]
    assert list(valid["directions"]) == DIRECTIONS
    for key in ("loss", "nll", "bleu"):
        figures = [valid["directions"][d][key] for d in DIRECTIONS]
        assert valid[key] == pytest.approx(sum(figures) / len(figures))
    assert len({valid["directions"][d]["loss"] for d in DIRECTIONS}) == len(DIRECTIONS)
    assert valid["best"] == valid["loss"]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars = EventAccumulator(str(tmp_path / "run" / "tensorboard")).Reload().Tags()["scalars"]
    assert {f"valid/{d}/{k}" for d in DIRECTIONS for k in ("loss", "bleu")} <= set(scalars)
    # the checkpoint records the languages, tag ids as the tokenizer has them
    ckpt = load_checkpoint(tmp_path / "run" / "checkpoint_last.pt")
    languages = LanguageTags.from_dict(ckpt["data"]["languages"], "checkpoint")
    assert languages == LanguageTags(
        "decoder",
        tag_ids(multilingual_data_dir),
        tuple(DIRECTIONS),
        {lang: tag_piece(lang) for lang in LANGS},
    )


def test_the_best_checkpoint_follows_validation_direction(multilingual_data_dir, tmp_path):
    cfg = multi_config(
        multilingual_data_dir,
        tmp_path / "run",
        max_update=4,
        directions=["en-de", "de-fr"],
        validation={"split": "valid", "direction": "de-fr", "interval_updates": 2},
    )
    run_training(cfg)
    events = [json.loads(line) for line in (tmp_path / "run" / "train.jsonl").open()]
    valids = [e for e in events if e["type"] == "valid"]
    assert [list(v["directions"]) for v in valids] == [["en-de", "de-fr"]] * 2
    assert valids[-1]["best"] == min(v["directions"]["de-fr"]["loss"] for v in valids)
    assert valids[-1]["best"] != min(v["loss"] for v in valids)


def test_decoder_tags_are_forced_and_dropped_when_decoding_for_bleu(
    multilingual_data_dir, tmp_path
):
    from nmt.data.collate import collate
    from nmt.generation.config import SearchConfig
    from nmt.generation.generator import SequenceGenerator

    t = build_training(
        multi_config(
            multilingual_data_dir, tmp_path, lang_tag="decoder", validation={"split": "valid"}
        )
    )
    fr = tag_ids(multilingual_data_dir)["fr"]
    valid = next(v for v in t.data.valid_sets if v.direction == "en-fr")
    assert valid.target_prefix == (fr,)
    batch = collate(valid.bleu_indices[:4], valid.dataset.pairs(valid.bleu_indices[:4]))
    model = t.model.eval()
    hyps = decode_for_validation(model, batch, beam=1, len_a=0, len_b=5, target_prefix=(fr,))
    generator = SequenceGenerator([model], SearchConfig(beam=1, max_len_a=0, max_len_b=5))
    forced = generator.generate(batch.src_tokens, torch.full((4, 1), fr))
    assert all(h[0].tokens[0] == fr for h in forced)
    assert hyps == [[i for i in h[0].tokens.tolist()[1:] if i != EOS] for h in forced]
    t.run_lock.close()


# ------------------------------------------------------------------ resume


def test_resume_on_a_multilingual_run_is_bitwise_equal_to_an_uninterrupted_one(
    multilingual_data_dir, tmp_path
):
    """Tags, temperature draws (fractions drawn anew per epoch) and epochs crossed."""
    common = dict(lang_tag="src_tgt", sampling_temperature=3.0, update_freq=2)
    data = load_train_data(multi_config(multilingual_data_dir, tmp_path, **common))
    per_epoch = -(-len(data.epoch_batches(1)) // 2)
    total = per_epoch + 4
    run_training(
        multi_config(multilingual_data_dir, tmp_path / "straight", max_update=total, **common)
    )
    for first in (3, per_epoch):
        run = tmp_path / f"resumed-{first}"
        run_training(multi_config(multilingual_data_dir, run, max_update=first, **common))
        run_training(multi_config(multilingual_data_dir, run, max_update=total, **common))
        assert_bitwise_equal(last_params(run), last_params(tmp_path / "straight"))


@pytest.mark.parametrize(
    "change, message",
    [
        ({"lang_tag": "decoder"}, "lang_tag=decoder: {ckpt} was trained with lang_tag=tgt"),
        (
            {"directions": ["en-de", "de-en"]},
            "directions=[en-de,de-en]: {ckpt} was trained with directions=[en-de,de-en,en-fr",
        ),
        (
            {"sampling_temperature": 2.0},
            "sampling_temperature=2.0: {ckpt} was trained with sampling_temperature=1.0",
        ),
    ],
)
def test_resume_refuses_changed_language_options(multilingual_data_dir, tmp_path, change, message):
    run_training(multi_config(multilingual_data_dir, tmp_path, max_update=1))
    ckpt = tmp_path / "checkpoint_last.pt"
    cfg = multi_config(
        multilingual_data_dir,
        tmp_path,
        max_update=2,
        resume={"reset_data_check": True},  # not waived: the batches would differ
        **change,
    )
    with pytest.raises(NmtError) as err:
        build_training(cfg)
    assert str(err.value).startswith(message.format(ckpt=ckpt))
    assert "resume.finetune_from=" in str(err.value) and "\n" not in str(err.value)
