"""Target-vocabulary shortlists: the file (nmt.data.lexical.Shortlist, CTranslate2's vmap
format), and decoding over them (nmt.generation.shortlist): a shortlist of every token is
the full search exactly, a reduced one is the full search where the rest is impossible,
and a sentence's translation never depends on its batch's other candidates."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from nmt import Translator
from nmt.checkpoint import load_checkpoint, save_checkpoint
from nmt.data.lexical import Shortlist
from nmt.data.tokenizer import Tokenizer
from nmt.errors import NmtError
from nmt.vocab import EOS

pytestmark = pytest.mark.usefixtures("one_thread")

SEARCH = dict(beam=4, max_len_a=1.0, max_len_b=6)


@pytest.fixture(scope="module")
def checkpoint(tiny_trained_checkpoint) -> Path:
    return tiny_trained_checkpoint


@pytest.fixture(scope="module")
def tokenizer(demo_data_dir) -> Tokenizer:
    return Tokenizer.from_file(demo_data_dir / "spm.model")


@pytest.fixture(scope="module")
def texts(demo_corpus) -> list[str]:
    return (demo_corpus / "test.en").read_text(encoding="utf-8").splitlines()[:10]


def write_vmap(path: Path, tokenizer: Tokenizer, rules: dict[tuple[int, ...], list[int]]) -> Path:
    """A shortlist file from ids: {source ids (() = every sentence): target ids}."""
    pieces = tokenizer.pieces()
    lines = [
        " ".join(pieces[s] for s in source) + "\t" + " ".join(pieces[t] for t in targets)
        for source, targets in rules.items()
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _tokens_and_scores(results):
    return [[(t.pieces, t.score, t.token_scores) for t in per] for per in results]


# -- the file ---------------------------------------------------------------------------


def test_candidates_are_the_always_line_specials_ngrams_and_prefix(tokenizer, tmp_path):
    path = write_vmap(tmp_path / "v.txt", tokenizer, {(): [10, 11], (20,): [30], (20, 21): [40]})
    shortlist = Shortlist.from_file(path, tokenizer, tokenizer)
    assert shortlist.candidates(np.array([5, 6])).tolist() == [0, 1, 2, 3, 10, 11]
    assert shortlist.candidates(np.array([20, 5])).tolist() == [0, 1, 2, 3, 10, 11, 30]
    assert shortlist.candidates(np.array([20, 21])).tolist() == [0, 1, 2, 3, 10, 11, 30, 40]
    assert shortlist.candidates(np.array([21, 20]), np.array([99])).tolist() == [
        0,
        1,
        2,
        3,
        10,
        11,
        30,
        99,
    ]


@pytest.mark.parametrize(
    "content, message",
    [
        ("\t{a}\n{a} {b}\n", r"v\.txt:2: no tab; each line is 'source pieces<TAB>target"),
        ("{a}\t{b}\t{a}\n", r"v\.txt:1: 2 tabs; each line is"),
        (
            "{a}\t{b}\n▁zwölfxyz\t{a}\n",
            r"v\.txt:2: '▁zwölfxyz' is not a piece of the model's source",
        ),
        ("{a}\t▁notapiece\n", r"v\.txt:1: '▁notapiece' is not a piece of the model's target"),
        ("{a}\t{a}\n{a}\t{b}\n", r"v\.txt:2: source '.*' listed again \(first on line 1\)"),
        ("\n\n", r"v\.txt: no candidates in it"),
    ],
    ids=["no-tab", "two-tabs", "unknown-source", "unknown-target", "twice", "empty"],
)
def test_a_bad_file_is_one_line_naming_file_and_line(tokenizer, tmp_path, content, message):
    pieces = tokenizer.pieces()
    path = tmp_path / "v.txt"
    path.write_text(content.format(a=pieces[10], b=pieces[11]), encoding="utf-8")
    with pytest.raises(NmtError, match=message):
        Shortlist.from_file(path, tokenizer, tokenizer)


def test_a_missing_or_binary_file_is_one_line(tokenizer, tmp_path):
    with pytest.raises(NmtError, match=r"^shortlist=.*nope\.txt: no such file; build one with"):
        Shortlist.from_file(tmp_path / "nope.txt", tokenizer, tokenizer)
    (tmp_path / "bin.txt").write_bytes(b"\t\xe2\x96\x81a\n\xff\xfe\n")
    with pytest.raises(NmtError, match=r"bin\.txt:2: not UTF-8 text"):
        Shortlist.from_file(tmp_path / "bin.txt", tokenizer, tokenizer)


# -- decoding ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        dict(beam=4),
        dict(beam=1),
        dict(beam=3, no_repeat_ngram_size=2, min_len=3, unkpen=0.5),
        dict(beam=3, sampling=True, sampling_topk=5, seed=7),
    ],
    ids=["beam", "greedy", "rules", "sampling"],
)
def test_a_shortlist_of_every_token_is_the_full_search(
    checkpoint, tokenizer, texts, tmp_path, options
):
    every = write_vmap(tmp_path / "all.txt", tokenizer, {(): list(range(4, tokenizer.vocab_size))})
    kw = dict(max_len_a=1.0, max_len_b=6, nbest=2 if options["beam"] > 1 else 1, **options)
    full = Translator.from_checkpoint(checkpoint, device="cpu", **kw)
    short = Translator.from_checkpoint(checkpoint, device="cpu", shortlist=every, **kw)
    prefixes = [None, "Du", None, "hundert", *[None] * 6]
    for prefix in (None, prefixes):
        want = full.translate_batch(texts, return_scores=True, prefixes=prefix)
        got = short.translate_batch(texts, return_scores=True, prefixes=prefix)
        assert _tokens_and_scores(got) == _tokens_and_scores(want)  # exactly


def _impossible(checkpoint: Path, out: Path, banned: list[int]) -> Path:
    """The checkpoint with `banned` target tokens made impossible: one output feature is
    held at 1 (its LayerNorm weight 0, bias 1) and the output layer reads it as a logit
    of -1e4 for them (0 for the rest), so their probability is exactly 0 in fp32."""
    ckpt = load_checkpoint(checkpoint)
    state = ckpt["model"]
    layers = ckpt["model_config"]["decoder_layers"]
    norm = f"decoder.layers.{layers - 1}.final_layer_norm"  # the post-norm model's last
    state[f"{norm}.weight"][0], state[f"{norm}.bias"][0] = 0.0, 1.0
    weight = state["decoder.output_projection.weight"]  # [V,D] (tied: the embeddings too)
    weight[:, 0] = 0.0
    weight[banned, 0] = -1e4
    save_checkpoint(ckpt, out)
    return out


def test_a_reduced_shortlist_is_the_full_search_where_the_rest_is_impossible(
    checkpoint, tokenizer, texts, tmp_path
):
    """Candidates per sentence (source words -> targets, and a few for every sentence) on
    a model that gives every other token probability 0: the reduced search (masks, column
    mapping, rules, prefixes, sentences leaving the batch) must find the full search's
    translations, with the same scores up to the softmax's summation order."""
    rng = np.random.default_rng(0)
    ids = np.arange(4, tokenizer.vocab_size)
    always = rng.choice(ids, 60, replace=False).tolist()
    rules: dict[tuple[int, ...], list[int]] = {(): always}
    src_ids = sorted({i for t in texts for i in tokenizer.encode(t)})
    for s in src_ids:
        rules[(s,)] = rng.choice(ids, 15, replace=False).tolist()
    vmap = write_vmap(tmp_path / "v.txt", tokenizer, rules)
    shortlist = Shortlist.from_file(vmap, tokenizer, tokenizer)
    for i, text in enumerate(texts):  # one sentence at a time, each with its own candidates
        source = np.array(tokenizer.encode(text) + [EOS])
        allowed = shortlist.candidates(source)
        banned = sorted(set(range(tokenizer.vocab_size)) - set(allowed.tolist()) - {0, 1, 2, 3})
        model = _impossible(checkpoint, tmp_path / f"m{i}.pt", banned)
        for options in (dict(beam=4, nbest=2, no_repeat_ngram_size=2), dict(beam=1)):
            kw = dict(max_len_a=1.0, max_len_b=6, **options)
            full = Translator.from_checkpoint(model, device="cpu", **kw)
            short = Translator.from_checkpoint(model, device="cpu", shortlist=vmap, **kw)
            want = full.translate_batch([text], return_scores=True)[0]
            got = short.translate_batch([text], return_scores=True)[0]
            assert [t.pieces for t in got] == [t.pieces for t in want]
            for a, b in zip(got, want):
                assert a.token_scores == pytest.approx(b.token_scores, abs=1e-5)


def test_batch_composition_never_changes_a_translation_with_a_shortlist(
    checkpoint, tokenizer, texts, tmp_path
):
    rng = np.random.default_rng(1)
    ids = np.arange(4, tokenizer.vocab_size)
    rules: dict[tuple[int, ...], list[int]] = {(): rng.choice(ids, 30, replace=False).tolist()}
    for s in sorted({i for t in texts for i in tokenizer.encode(t)}):
        rules[(s,)] = rng.choice(ids, 10, replace=False).tolist()
    vmap = write_vmap(tmp_path / "v.txt", tokenizer, rules)
    together = Translator.from_checkpoint(checkpoint, device="cpu", shortlist=vmap, **SEARCH)
    want = together.translate_batch(texts, return_scores=True, nbest=2)
    alone = [together.translate_batch([t], return_scores=True, nbest=2)[0] for t in texts]
    small = Translator.from_checkpoint(
        checkpoint, device="cpu", shortlist=vmap, max_sentences=3, **SEARCH
    )
    mixed = small.translate_batch(texts[::-1], return_scores=True, nbest=2)[::-1]
    for got in (alone, mixed):
        assert [[t.pieces for t in per] for per in got] == [[t.pieces for t in per] for per in want]
        for a, b in zip(got, want):
            assert [t.score for t in a] == pytest.approx([t.score for t in b], abs=1e-5)
    # every output token is a candidate of its own sentence
    shortlist = Shortlist.from_file(vmap, tokenizer, tokenizer)
    for text, per in zip(texts, want):
        allowed = set(shortlist.candidates(np.array(tokenizer.encode(text))).tolist())
        for t in per:
            assert {tokenizer.pieces().index(p) for p in t.pieces} <= allowed


def test_a_forced_prefix_is_kept_even_outside_the_shortlist(checkpoint, tokenizer, tmp_path):
    vmap = write_vmap(tmp_path / "v.txt", tokenizer, {(): [10, 11, 12]})
    translator = Translator.from_checkpoint(checkpoint, device="cpu", shortlist=vmap, **SEARCH)
    prefix = "Anna will"
    pieces = tokenizer.encode_as_pieces(prefix)
    out = translator.translate_batch(["Anna wants to sell two cars."], prefixes=[prefix])[0]
    assert out[0].pieces[: len(pieces)] == pieces


def test_int8_with_a_shortlist_of_every_token_is_int8(checkpoint, tokenizer, texts, tmp_path):
    every = write_vmap(tmp_path / "all.txt", tokenizer, {(): list(range(4, tokenizer.vocab_size))})
    full = Translator.from_checkpoint(checkpoint, device="cpu", precision="int8", **SEARCH)
    short = Translator.from_checkpoint(
        checkpoint, device="cpu", precision="int8", shortlist=every, **SEARCH
    )
    want = full.translate_batch(texts, return_scores=True)
    assert _tokens_and_scores(short.translate_batch(texts, return_scores=True)) == (
        _tokens_and_scores(want)
    )


def test_the_shortlist_file_is_read_before_the_models(checkpoint, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("no tab here\n", encoding="utf-8")
    with pytest.raises(NmtError, match=r"bad\.txt:1: no tab"):
        Translator.from_checkpoint(checkpoint, device="cpu", shortlist=bad)
    shutil.copy(checkpoint, tmp_path / "c.pt")
    with pytest.raises(NmtError, match=r"^shortlist=.*missing\.txt: no such file"):
        Translator.from_checkpoint(
            tmp_path / "c.pt", device="cpu", shortlist=tmp_path / "missing.txt"
        )


def test_search_rows_keep_their_own_candidates_when_sentences_leave(
    checkpoint, tokenizer, tmp_path
):
    """Sentences of very different lengths finish at different steps and leave the batch:
    the masks must leave with them (a wrong row would let a sentence use another's words)."""
    rules: dict[tuple[int, ...], list[int]] = {(): [10]}
    rng = np.random.default_rng(2)
    texts = ["one.", "Anna wants to count four hundred nineteen car windows and two tables."]
    texts += ["two."] * 6
    for s in sorted({i for t in texts for i in tokenizer.encode(t)}):
        rules[(s,)] = rng.choice(np.arange(4, tokenizer.vocab_size), 8, replace=False).tolist()
    vmap = write_vmap(tmp_path / "v.txt", tokenizer, rules)
    kw = dict(beam=2, max_len_a=1.5, max_len_b=4)
    translator = Translator.from_checkpoint(checkpoint, device="cpu", shortlist=vmap, **kw)
    together = translator.translate_batch(texts, return_scores=True)
    for text, per in zip(texts, together):
        alone = translator.translate_batch([text], return_scores=True)[0]
        assert [t.pieces for t in alone] == [t.pieces for t in per]
    assert torch.get_num_threads() == 1
