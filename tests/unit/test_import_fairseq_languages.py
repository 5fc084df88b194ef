"""nmt-import-fairseq of a fairseq multilingual model (translation_multi_simple_epoch, with
__en__-style language tokens), built here without fairseq as the single-pair import tests
build theirs: the imported model computes the fairseq model's logits on tagged inputs,
its tokens are nmt's tags (control symbols), and nmt translates with tgt_lang=; placements
nmt has no style for are one-line errors."""

from __future__ import annotations

import argparse
from collections import OrderedDict
from pathlib import Path

import pytest
import sentencepiece as spm
import torch
from omegaconf import OmegaConf
from rounding import assert_same_function, float64_twin

from nmt import Translator
from nmt.data.tokenizer import normalize_text
from nmt.errors import NmtError
from nmt.generation.loading import load_for_inference
from nmt.interop.config import ImportFairseqConfig
from nmt.interop.fairseq_import import import_fairseq_checkpoint
from nmt.model.config import ModelConfig
from nmt.model.transformer import Transformer
from tests.unit.test_import_fairseq import _args, _lines, _pieces, _spm_default_ids, _write_dict

LANGS = ["en", "de", "fr"]
PAIRS = "en-de,de-en,en-fr"
CFG = ModelConfig(
    embed_dim=16,
    ffn_dim=32,
    attention_heads=2,
    encoder_layers=2,
    decoder_layers=2,
    dropout=0.0,
    max_source_positions=64,
    max_target_positions=64,
    share_all_embeddings=True,
)
SOURCES = ["Anna wants to sell nine hundred lamps.", "Du hast acht Tische verkauft."]
TARGETS = ["Anna will neunhundert Lampen verkaufen.", "You sold eight tables."]


@pytest.fixture(scope="module")
def joint_spm(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("spm") / "joint.model"
    path.write_bytes(_spm_default_ids(_lines("en") + _lines("de"), 160))
    return path


def _task(style: str, **extra) -> dict:
    """The options translation_multi_simple_epoch records (--langs, --lang-pairs, where the
    tokens go)."""
    task = dict(
        _name="translation_multi_simple_epoch",
        langs=LANGS,
        lang_pairs=PAIRS,
        encoder_langtok="tgt" if style == "tgt" else None,
        decoder_langtok=style == "decoder",
        lang_tok_style="multilingual",
        lang_tok_replacing_bos_eos=False,
        source_lang=None,
        target_lang=None,
    )
    task.update(extra)
    return task


def _fairseq_multilingual(tmp: Path, joint_spm: Path, task: dict, namespace: bool):
    """A random model over dict.txt plus the task's language tokens, saved as fairseq
    saves it (the task's options in args, or in cfg.task)."""
    symbols = _write_dict(tmp / "dict.en.txt", _pieces(joint_spm), seed=1)
    for lang in LANGS[1:]:
        (tmp / f"dict.{lang}.txt").write_bytes((tmp / "dict.en.txt").read_bytes())
    symbols += [f"__{lang}__" for lang in LANGS]  # what the task adds to every dictionary
    torch.manual_seed(0)
    model = Transformer(CFG, len(symbols), len(symbols)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    state = OrderedDict((k, v.clone()) for k, v in model.state_dict().items())
    state["encoder.embed_positions._float_tensor"] = torch.tensor([0.0])
    args = _args(CFG, source_lang=None, target_lang=None)
    if namespace:  # fairseq < 0.10: model and task options in one Namespace
        name = task.pop("_name")
        obj = {"args": argparse.Namespace(**{**args, **task, "task": name}), "model": state}
    else:
        obj = {
            "args": None,
            "cfg": OmegaConf.create({"model": {"_name": "transformer", **args}, "task": task}),
            "model": state,
        }
    torch.save(obj, tmp / "checkpoint_best.pt")
    return model, symbols


def _import(tmp: Path, joint_spm: Path, **options) -> Path:
    out = tmp / "imported.pt"
    result = import_fairseq_checkpoint(
        ImportFairseqConfig(
            checkpoint=str(tmp / "checkpoint_best.pt"),
            spm=str(joint_spm),
            output=str(out),
            overwrite=True,
            **options,
        )
    )
    assert result.lines()[-1].startswith(f"wrote {out} (languages en, de, fr; lang_tag=")
    return out


@pytest.mark.parametrize(
    "style, namespace", [("tgt", True), ("decoder", False)], ids=["tgt-args", "decoder-cfg"]
)
def test_imported_model_gives_fairseq_logits_on_tagged_inputs(
    style, namespace, joint_spm, tmp_path
):
    fs_model, symbols = _fairseq_multilingual(tmp_path, joint_spm, _task(style), namespace)
    out = _import(tmp_path, joint_spm)
    bundle = load_for_inference(out)
    tags = bundle.data["languages"]
    assert tags["style"] == style and tags["directions"] == PAIRS.split(",")
    assert tags["pieces"] == {lang: f"__{lang}__" for lang in LANGS}
    assert (bundle.data["src_lang"], bundle.data["tgt_lang"]) == ("en", "de")
    tok = bundle.src_tokenizer
    sp = spm.SentencePieceProcessor(model_proto=tok.model_bytes)
    for lang, tag_id in tags["ids"].items():
        assert sp.is_control(tag_id) and sp.id_to_piece(tag_id) == f"__{lang}__"
    assert all(tags["ids"]["de"] not in tok.encode(t) for t in ("__de__ one", "x __de__"))

    # fairseq's inputs (its dictionary ids) and nmt's, each with its tag where it goes
    index = {s: i for i, s in enumerate(symbols)}
    fs_sp = spm.SentencePieceProcessor(model_file=str(joint_spm))
    langs = ["de", "en"]

    def fs_ids(text: str) -> list[int]:
        return [index.get(p, 3) for p in fs_sp.encode(text, out_type=str)] + [2]

    def nmt_ids(text: str) -> list[int]:
        return tok.encode(normalize_text(text, False)) + [2]

    def batch(rows: list[list[int]]) -> torch.Tensor:
        width = max(map(len, rows))
        return torch.tensor([r + [1] * (width - len(r)) for r in rows])

    fs_tag = {lang: index[f"__{lang}__"] for lang in LANGS}
    nmt_tag = tags["ids"]
    source_tag = style == "tgt"
    fs_src = batch([[fs_tag[g]] * source_tag + fs_ids(s) for s, g in zip(SOURCES, langs)])
    nmt_src = batch([[nmt_tag[g]] * source_tag + nmt_ids(s) for s, g in zip(SOURCES, langs)])
    fs_prev = batch(
        [[2] + [fs_tag[g]] * (not source_tag) + fs_ids(t)[:-1] for t, g in zip(TARGETS, langs)]
    )
    nmt_prev = batch(
        [[2] + [nmt_tag[g]] * (not source_tag) + nmt_ids(t)[:-1] for t, g in zip(TARGETS, langs)]
    )
    assert fs_src.shape == nmt_src.shape and fs_prev.shape == nmt_prev.shape
    with torch.no_grad():
        expected = fs_model(fs_src, fs_prev)  # [B,T,V_fairseq]
        got = bundle.model(nmt_src, nmt_prev)  # [B,T,V_nmt]
        exact = float64_twin(fs_model)(fs_src, fs_prev)
    pieces = [sp.id_to_piece(j) for j in range(tok.vocab_size)]
    columns = torch.tensor([index[p] if j > 3 else j for j, p in enumerate(pieces)])
    real = fs_prev.ne(1)
    assert_same_function(got[real], expected[..., columns][real], exact[..., columns][real])

    # nmt translates with it into the language asked for, the tag nowhere in the output
    translator = Translator.from_checkpoint(out, device="cpu", beam=2, max_len_b=8)
    assert translator.languages is not None and translator.languages.style == style
    results = translator.translate_batch(SOURCES, tgt_lang=langs)
    assert all("__" not in " ".join(r[0].pieces) for r in results)
    with pytest.raises(NmtError, match=r"^tgt_lang=it: the model does not translate into it"):
        translator.translate(SOURCES, tgt_lang="it")


def test_options_over_what_the_checkpoint_records(joint_spm, tmp_path):
    """langs= gives an order --lang-dict kept outside the checkpoint; lang_tag= a
    placement the checkpoint does not record, and must agree with one it does."""
    task = _task("tgt", langs=None, lang_dict="/elsewhere/langs.txt")
    _fairseq_multilingual(tmp_path, joint_spm, task, namespace=False)
    with pytest.raises(NmtError, match=r"^langs=\[\]: .* --lang-dict /elsewhere/langs.txt; give"):
        _import(tmp_path, joint_spm)
    out = _import(tmp_path, joint_spm, langs=LANGS)
    assert load_for_inference(out).data["languages"]["pieces"]["fr"] == "__fr__"
    with pytest.raises(NmtError, match=r"^lang_tag=decoder: .* lang_tag=tgt's placement"):
        _import(tmp_path, joint_spm, langs=LANGS, lang_tag="decoder")
    untold = _task("tgt", encoder_langtok=None, decoder_langtok=False)
    _fairseq_multilingual(tmp_path, joint_spm, untold, namespace=False)
    with pytest.raises(NmtError, match=r"^lang_tag=null: .* does not record where"):
        _import(tmp_path, joint_spm)
    out = _import(tmp_path, joint_spm, lang_tag="decoder")
    assert load_for_inference(out).data["languages"]["style"] == "decoder"


@pytest.mark.parametrize(
    "extra, message",
    [
        (dict(encoder_langtok="src", decoder_langtok=True), r"go on the source \(src\) and "),
        (dict(lang_tok_replacing_bos_eos=True), r"replace BOS/EOS"),
        (dict(lang_pairs="en-de,de-it"), r"^langs=\[en,de,fr\]: the model's direction de-it"),
    ],
    ids=["both-sides", "replacing-bos-eos", "pair-outside-langs"],
)
def test_placements_nmt_has_no_style_for_are_named(extra, message, joint_spm, tmp_path):
    _fairseq_multilingual(tmp_path, joint_spm, _task("tgt", **extra), namespace=False)
    with pytest.raises(NmtError, match=message):
        _import(tmp_path, joint_spm)
    assert not (tmp_path / "imported.pt").exists()


def test_lang_tag_option_is_checked(tmp_path):
    cfg = ImportFairseqConfig(checkpoint="a.pt", spm="s.model", output="o.pt", lang_tag="src")
    with pytest.raises(NmtError, match=r"^lang_tag=src: unknown; use one of tgt, decoder$"):
        cfg.validate()


def test_the_command_takes_langs_as_a_list(nmt_cli, joint_spm, tmp_path):
    task = _task("decoder", langs=None, lang_dict="langs.txt")
    _fairseq_multilingual(tmp_path, joint_spm, task, namespace=True)
    out = tmp_path / "cli.pt"
    args = (f"checkpoint={tmp_path / 'checkpoint_best.pt'}", f"spm={joint_spm}", f"output={out}")
    code, _, err = nmt_cli("import_fairseq", *args)
    assert code == 2 and "langs=[]: " in err and "--lang-dict langs.txt" in err, err
    code, stdout, err = nmt_cli("import_fairseq", *args, "langs=[en,de,fr]")
    assert code == 0, err
    assert "languages en, de, fr; lang_tag=decoder" in stdout + err
    assert load_for_inference(out).data["languages"]["directions"] == PAIRS.split(",")
