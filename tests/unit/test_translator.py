"""nmt.Translator, the one translation core, on a tiny checkpoint trained here (invariants:
batch composition, forced decoding = the model's loss, prefixes, threads, ensembles)."""

from __future__ import annotations

import inspect
import logging
import math
import subprocess
import sys
import threading
from dataclasses import fields
from pathlib import Path

import pytest
import torch

from nmt import TargetScore, Translation, Translator
from nmt.data.binarize import TokenArray
from nmt.data.meta import load_meta, split_prefix
from nmt.data.tokenizer import normalize_text
from nmt.errors import NmtError
from nmt.generation.config import SearchConfig
from nmt.model.config import ModelConfig
from nmt.model.packed import FP32_GEMM_ENV, PackedLinear, onednn_fp32_available
from nmt.model.transformer import Transformer
from nmt.vocab import EOS, PAD
from tests.helpers import run_training, tiny_config
from tests.rounding import logprob_tolerance, sum_tolerance, text_logprob_tolerance

pytestmark = pytest.mark.usefixtures("one_thread")

REPO = Path(__file__).resolve().parents[2]
SEARCH = dict(beam=4, max_len_a=1.0, max_len_b=5)  # a tiny model's outputs stay short


@pytest.fixture(scope="module")
def checkpoint(demo_data_dir, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("translator-run")
    run_training(tiny_config(demo_data_dir, run, max_update=60))
    return run / "checkpoint_last.pt"


@pytest.fixture(scope="module")
def translator(checkpoint) -> Translator:
    return Translator.from_checkpoint(checkpoint, device="cpu", nbest=2, **SEARCH)


@pytest.fixture(scope="module")
def texts(demo_corpus) -> list[str]:
    lines = (demo_corpus / "test.en").read_text(encoding="utf-8").splitlines()[:14]
    lines[3] = ""  # an empty line
    lines[8] = "  " + lines[8].upper() + "\t"  # whitespace the normalization removes
    return lines


def _tokens(results: list[list[Translation]]) -> list[list[list[str]]]:
    return [[t.pieces for t in per_source] for per_source in results]


def test_translate_is_the_best_of_translate_batch(translator, texts):
    best = translator.translate(texts)
    batch = translator.translate_batch(texts, return_scores=True)
    assert best == [per_source[0].text for per_source in batch]
    assert best[3] == "" and len(batch[3]) == 1 and batch[3][0].pieces == []
    for i, per_source in enumerate(batch):
        if i == 3:
            continue
        assert len(per_source) == 2  # nbest=2
        assert per_source[0].score >= per_source[1].score  # best first
        for t in per_source:
            assert len(t.token_scores) == len(t.pieces) + 1  # EOS scored too
            mean = sum(t.token_scores) / len(t.token_scores)  # the same fp32 values, summed
            assert t.score == pytest.approx(mean, abs=sum_tolerance(t.token_scores, 0.0))
            assert t.alignment is None


@pytest.mark.parametrize("gemm", ["torch", "onednn"])
def test_batch_composition_never_changes_a_translation(checkpoint, texts, gemm, monkeypatch):
    """On torch's GEMM and on oneDNN's (nmt.model.packed), every call of every layer."""
    if gemm == "onednn" and not onednn_fp32_available():
        pytest.skip("this torch has no oneDNN fp32 linear")
    monkeypatch.setenv(FP32_GEMM_ENV, gemm)
    monkeypatch.setattr("nmt.model.packed.ONEDNN_MIN_MACS", 1)
    together = Translator.from_checkpoint(checkpoint, device="cpu", **SEARCH)
    packed = any(isinstance(m, PackedLinear) for m in together.models[0].modules())
    assert packed == (gemm == "onednn")
    want = together.translate_batch(texts, return_scores=True)
    tolerance = text_logprob_tolerance(together, texts, [per[0].text for per in want])
    shuffled = texts[::-1]
    for other in (
        Translator.from_checkpoint(checkpoint, device="cpu", max_sentences=1, **SEARCH),
        Translator.from_checkpoint(checkpoint, device="cpu", max_tokens=30, **SEARCH),
        together,
    ):
        alone = [other.translate_batch([t], return_scores=True)[0] for t in texts]
        mixed = other.translate_batch(shuffled, return_scores=True)[::-1]
        for got in (alone, mixed):
            assert _tokens(got) == _tokens(want)
            for a, b in zip(got, want):
                assert [t.score for t in a] == pytest.approx([t.score for t in b], abs=tolerance)


def test_nbest_scores_and_alignments_per_call(translator, texts):
    results = translator.translate_batch(texts, nbest=4, return_scores=True, return_alignment=True)
    plain = translator.translate_batch(texts, nbest=1)
    for i, (per_source, best) in enumerate(zip(results, plain)):
        if i == 3:
            assert per_source[0].alignment == []
            continue
        assert len(per_source) == 4
        assert per_source[0].text == best[0].text  # attention does not change the search
        src_len = len(translator.src_tokenizer.encode(normalize_text(texts[i], False)))
        for t in per_source:
            assert [tgt for _, tgt in t.alignment] == list(range(len(t.pieces)))
            assert all(0 <= src < src_len for src, _ in t.alignment)
    with pytest.raises(NmtError, match=r"^nbest=5: must be between 1 and beam=4"):
        translator.translate_batch(texts, nbest=5)


def _independent_log_probs(model, tokenizer, source: str, target: str) -> torch.Tensor:
    """log p(target token | ...) per target token (EOS included), from Transformer.forward
    and log_softmax alone: one sentence, no padding, no batching code of nmt's."""
    src = torch.tensor([tokenizer.encode(normalize_text(source, False)) + [EOS]])
    tgt = torch.tensor(tokenizer.encode(normalize_text(target, False)) + [EOS])
    prev = torch.cat([torch.tensor([EOS]), tgt[:-1]])[None]
    with torch.no_grad():
        lprobs = torch.log_softmax(model(src, prev)[0].float(), dim=-1)  # [T,V]
    return lprobs.gather(1, tgt[:, None]).squeeze(1)


def test_score_is_the_models_loss_on_the_pair(checkpoint, translator, texts, demo_corpus):
    refs = (demo_corpus / "test.de").read_text(encoding="utf-8").splitlines()[: len(texts)]
    refs[5] = ""  # an empty target: p(EOS | source)
    sources = [t if t else "a" for t in texts]  # (an empty source is scored as [EOS])
    model = translator.models[0]
    tolerance = text_logprob_tolerance(translator, sources, refs)
    for lenpen in (1.0, 0.5):
        scorer = Translator.from_checkpoint(checkpoint, device="cpu", lenpen=lenpen)
        scores = scorer.score(sources, refs)
        for src, ref, got in zip(sources, refs, scores):
            assert isinstance(got, TargetScore)
            want = _independent_log_probs(model, translator.src_tokenizer, src, ref)
            token_scores = want.tolist()
            assert got.token_scores == pytest.approx(token_scores, abs=tolerance)
            total = sum_tolerance(token_scores, tolerance, lenpen=0.0)  # a sum
            assert got.log_prob == pytest.approx(float(want.sum()), abs=total)
            score = float(want.sum()) / len(want) ** lenpen
            assert got.score == pytest.approx(
                score, abs=sum_tolerance(token_scores, tolerance, lenpen)
            )
            assert got.pieces == translator.tgt_tokenizer.encode_as_pieces(
                normalize_text(ref, False)
            )


def test_score_of_a_translation_is_its_reported_score(translator, texts):
    """Forced decoding of the search's own output gives the scores the search reported."""
    ids = [translator.src_tokenizer.encode(normalize_text(t, False)) + [EOS] for t in texts if t]
    hyps = translator.translate_ids(ids, nbest=2)
    pairs = [(i, h.tokens.tolist()) for i, per in zip(ids, hyps) for h in per]
    tolerance = logprob_tolerance(translator.models[0], pairs)
    for rank in (0, 1):
        scored = translator.score_ids(ids, [h[rank].tokens for h in hyps])
        for per_source, got in zip(hyps, scored):
            want = per_source[rank]
            assert got.tokens.tolist() == want.tokens.tolist()
            assert got.positional_scores.tolist() == pytest.approx(
                want.positional_scores.tolist(), abs=tolerance
            )
            assert got.score == pytest.approx(want.score, abs=tolerance)  # means (lenpen 1)


def test_an_ensemble_averages_log_probs(checkpoint, translator, texts):
    pair = Translator.from_checkpoint([checkpoint, checkpoint], device="cpu", nbest=2, **SEARCH)
    assert len(pair.models) == 2
    assert _tokens(pair.translate_batch(texts)) == _tokens(translator.translate_batch(texts))
    one, two = translator.score(texts[:3], texts[3:6]), pair.score(texts[:3], texts[3:6])
    tolerance = text_logprob_tolerance(translator, texts[:3], texts[3:6])
    for a, b in zip(one, two):
        assert a.token_scores == pytest.approx(b.token_scores, abs=tolerance)


def test_prefixes_are_forced_per_sentence(translator, texts):
    sources = [t for t in texts if t][:6]
    prefixes = ["Sie kauften", None, "zwei", "", "Max", "hundert hundert hundert"]
    results = translator.translate_batch(sources, nbest=4, prefixes=prefixes)
    free = translator.translate_batch(sources, nbest=4)
    for prefix, per_source, unforced in zip(prefixes, results, free):
        if not prefix:
            assert _tokens([per_source]) == _tokens([unforced])
            continue
        pieces = translator.tgt_tokenizer.encode_as_pieces(prefix)
        for t in per_source:  # every hypothesis, not only the best
            assert t.pieces[: len(pieces)] == pieces
    with pytest.raises(NmtError, match="^prefixes: 1 of them for 6 texts"):
        translator.translate_batch(sources, prefixes=["x"])


def test_ids_in_equal_text_in(translator, demo_data_dir, demo_corpus):
    """A data dir split (ids as preprocess stored them) translates as its raw text does."""
    meta = load_meta(demo_data_dir)
    split = TokenArray(split_prefix(demo_data_dir, "test", meta.src_lang))
    text = (demo_corpus / "test.en").read_text(encoding="utf-8").splitlines()[:10]
    by_ids = translator.translate_ids([split[i] for i in range(10)], nbest=1)
    by_text = translator.translate_batch(text, nbest=1)
    assert [[translator.pieces(h.tokens[:-1].tolist()) for h in x] for x in by_ids] == _tokens(
        by_text
    )
    assert translator.translate_ids([[]]) == [[]]  # an empty source: nothing to translate


def test_concurrent_calls_equal_sequential_calls(checkpoint, texts):
    """Also with each thread's own search options (PER_CALL, and none)."""
    translator = Translator.from_checkpoint(checkpoint, device="cpu", max_sentences=3, **SEARCH)
    jobs = [texts[i:] + texts[:i] for i in range(6)]
    options = [{}, *PER_CALL[:5]]

    def call(i: int) -> list:
        return _tokens(translator.translate_batch(jobs[i], return_scores=True, **options[i]))

    want = [call(i) for i in range(len(jobs))]
    got: list = [None] * len(jobs)
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for _ in range(3):
                got[i] = call(i)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and got == want


def test_empty_and_overlong_lines(demo_data_dir, caplog):
    """Built from parts: a model accepting 8 source positions."""
    from nmt.data.tokenizer import load_tokenizers

    src_tok, tgt_tok = load_tokenizers(demo_data_dir)
    torch.manual_seed(0)
    cfg = ModelConfig(
        embed_dim=16,
        ffn_dim=32,
        attention_heads=2,
        encoder_layers=1,
        decoder_layers=1,
        dropout=0.0,
        max_source_positions=8,
        max_target_positions=8,
    )
    model = Transformer(cfg, src_tok.vocab_size, tgt_tok.vocab_size).eval()
    long = "one two three four five six seven eight nine ten eleven twelve"
    translator = Translator([model], src_tok, tgt_tok, search=SearchConfig(beam=2))
    with caplog.at_level(logging.WARNING, logger="nmt.generation"):
        out = translator.translate(["", long, "one two"])
    assert out[0] == "" and len(out) == 3
    assert any("input:2: " in r.message and "truncated" in r.message for r in caplog.records)
    cut = translator.translate_batch([long], return_scores=True)[0][0]
    assert len(cut.token_scores) <= 8  # the target side is capped too
    strict = Translator([model], src_tok, tgt_tok, search=SearchConfig(beam=2), overlong="error")
    with pytest.raises(NmtError, match=r"^input:2: \d+ tokens, the model accepts 8; "):
        strict.translate(["one", long])
    with pytest.raises(NmtError, match=r"^targets:1: \d+ tokens, the model accepts 8; "):
        strict.score(["one"], [long])


def test_options_are_checked_before_loading(tmp_path):
    missing = tmp_path / "missing.pt"
    for options, message in (
        (dict(beam=0), "beam=0: must be 1 or more; use 1 for greedy search"),
        (dict(beam=2, nbest=3), "nbest=3: must be between 1 and beam=2"),
        (dict(temperature=0.0), "temperature=0.0: must be positive"),
        (dict(temperature=1e-320), "temperature=1e-320: below 1e-06, where the logits overflow"),
        (dict(lenpen=float("nan")), "lenpen=nan: not a finite number"),
        (dict(max_len_a=float("inf")), "max_len_a=inf: not a finite number"),
        (dict(lenpen=400.0), "lenpen=400.0: out of range (-5 to 5)"),
        (dict(unkpen=float("-inf")), "unkpen=-inf: not a finite number"),
        (dict(unkpen=-1e308), "unkpen=-1e+308: out of range (-50 to 50)"),
        (dict(seed=2**70), f"seed={2**70}: out of range; use 0 to {2**63 - 1}"),
        (dict(seed=-1), "seed=-1: out of range"),
        (dict(sampling_topk=5), "sampling_topk=5: applies to sampling only; add sampling=true"),
        (dict(max_sentences=0), "max_sentences=0: must be 1 or more"),
        (dict(overlong="skip"), "overlong=skip: unknown; use one of truncate, error"),
        (dict(precision="fp8"), "precision=fp8: unknown"),
        (dict(precision="fp16", device="cpu"), "precision=fp16: needs a CUDA device"),
        (dict(device="tpu"), "device=tpu: "),
    ):
        with pytest.raises(NmtError) as exc:
            Translator.from_checkpoint(missing, **options)
        assert str(exc.value).startswith(message) and "\n" not in str(exc.value)
    with pytest.raises(NmtError, match="missing.pt: checkpoint not found"):
        Translator.from_checkpoint(missing, device="cpu")
    with pytest.raises(NmtError, match=r"^checkpoint=\[\]: "):
        Translator.from_checkpoint([], device="cpu")


def test_texts_must_be_a_list_of_strings(translator):
    with pytest.raises(TypeError, match=r"texts: pass a list of strings"):
        translator.translate("one sentence")
    with pytest.raises(TypeError, match=r"texts\[1\]: int, not a str"):
        translator.translate(["one", 2])
    with pytest.raises(NmtError, match="^targets: 1 of them for 2 sources"):
        translator.score(["a", "b"], ["c"])


def test_precision_bf16_runs_on_the_cpu(checkpoint, texts):
    bf16 = Translator.from_checkpoint(checkpoint, device="cpu", precision="bf16", **SEARCH)
    assert bf16.runtime.precision == "bf16"
    out = bf16.translate_batch(texts, return_scores=True)
    assert len(out) == len(texts) and all(math.isfinite(t[0].score) for t in out)


def _autocast_during_decoding(translator: Translator, texts: list[str]) -> set[bool]:
    """Whether CPU autocast was on at each decoder call of one translate()."""
    seen: set[bool] = set()
    hook = translator.models[0].decoder.register_forward_pre_hook(
        lambda *_: seen.add(torch.is_autocast_enabled("cpu"))
    )
    try:
        translator.translate(texts)
    finally:
        hook.remove()
    return seen


def test_half_weights_run_as_they_are_and_fp32_weights_under_autocast(checkpoint, texts):
    """Weights already cast to bf16 (as from_checkpoint does on CUDA) decode without
    autocast, whose casts would only add kernels; fp32 weights with precision=bf16 decode
    under it. The cast weights give a finite best hypothesis for every source."""
    bf16 = Translator.from_checkpoint(checkpoint, device="cpu", precision="bf16", **SEARCH)
    assert _autocast_during_decoding(bf16, texts) == {True}
    cast = Translator(
        [m.to(torch.bfloat16) for m in Translator.from_checkpoint(checkpoint, device="cpu").models],
        bf16.src_tokenizer,
        bf16.tgt_tokenizer,
        search=bf16.search,
        runtime=bf16.runtime,
    )
    assert _autocast_during_decoding(cast, texts) == {False}
    out = cast.translate_batch(texts, return_scores=True)
    assert all(p.dtype == torch.bfloat16 for p in cast.models[0].parameters())
    assert len(out) == len(texts) and all(math.isfinite(t[0].score) for t in out)


def test_the_search_options_are_searchconfigs_alone(checkpoint, tmp_path):
    """from_checkpoint names no search option: SearchConfig is their one list, and its
    defaults are a plain load's; a misspelled option is caught before loading."""
    params = inspect.signature(Translator.from_checkpoint).parameters
    assert not {f.name for f in fields(SearchConfig)} & set(params)
    assert Translator.from_checkpoint(checkpoint, device="cpu").search == SearchConfig()
    given = Translator.from_checkpoint(
        checkpoint, device="cpu", search=SearchConfig(beam=3, lenpen=0.6), lenpen=0.8
    )
    assert given.search == SearchConfig(beam=3, lenpen=0.8)
    missing = tmp_path / "missing.pt"
    for options, message in (
        (dict(beem=4), "beem=4: not a search option; did you mean beam?"),
        (dict(dtype="bf16"), "dtype=bf16: not a search option; use one of beam, nbest,"),
        (dict(beam="4"), "beam='4': not a whole number; e.g. beam=5"),
        (dict(lenpen=True), "lenpen=true: not a number; e.g. lenpen=1.0"),
        (dict(sampling=1), "sampling=1: not true or false; e.g. sampling=false"),
    ):
        with pytest.raises(NmtError) as exc:
            Translator.from_checkpoint(missing, **options)
        assert str(exc.value).startswith(message), str(exc.value)


PER_CALL = [
    dict(beam=1, nbest=1),  # (nbest=2, the translator's, would need a wider beam)
    dict(nbest=3),
    dict(lenpen=0.6, max_len_a=0.0, max_len_b=3),
    dict(min_len=2, no_repeat_ngram_size=2, unkpen=2.0),
    dict(sampling=True, beam=2, nbest=2, sampling_topk=5, temperature=0.7, seed=3),
    dict(sampling=True, beam=1, nbest=1, sampling_topp=0.9, seed=4, use_cache=False),
]


@pytest.mark.parametrize("options", PER_CALL, ids=lambda o: ",".join(o))
def test_per_call_options_decode_as_a_translator_built_with_them(
    checkpoint, translator, texts, options
):
    """A call's options override the translator's search for that call only, and decode
    exactly as a translator loaded with them (sampling: from its seed, at every call)."""
    built = Translator.from_checkpoint(
        checkpoint, device="cpu", **{**SEARCH, "nbest": 2, **options}
    )
    want = built.translate_batch(texts, return_scores=True)
    before = translator.search
    for _ in range(2):  # a call with options starts its own sampling stream each time
        got = translator.translate_batch(texts, return_scores=True, **options)
        assert got == want
    assert translator.translate(texts, **options) == [per[0].text for per in want]
    pieces = [translator.src_tokenizer.encode(normalize_text(t, False)) for t in texts]
    by_ids = translator.translate_ids([p + [EOS] if p else [] for p in pieces], **options)
    assert [[h.score for h in x] or [0.0] for x in by_ids] == [[t.score for t in x] for x in want]
    assert translator.search is before and translator.search == SearchConfig(nbest=2, **SEARCH)


def test_a_huge_max_len_is_the_models_limit(translator, texts):
    """max_len_a and max_len_b take any finite size: the model's limit caps them."""
    limit = translator.max_target_positions - 1
    capped = translator.translate(texts[:2], max_len_a=0.0, max_len_b=limit)
    assert translator.translate(texts[:2], max_len_a=1e308) == capped
    assert translator.translate(texts[:2], max_len_a=0.0, max_len_b=10**400) == capped
    assert len(translator.translate(texts[:2], max_len_b=10**400, min_len=2)) == 2


def test_per_call_options_are_checked_for_the_model(translator, texts, checkpoint):
    for options, message in (
        (dict(beem=2), "beem=2: not a search option; did you mean beam?"),
        (dict(beam=0), "beam=0: must be 1 or more"),
        (dict(nbest=5), "nbest=5: must be between 1 and beam=4"),
        (dict(min_len=5000), "min_len=5000: more than the model's longest output"),
        (dict(sampling_topk=3), "sampling_topk=3: applies to sampling only"),
    ):
        with pytest.raises(NmtError) as exc:
            translator.translate(texts, **options)
        assert str(exc.value).startswith(message), str(exc.value)
    with pytest.raises(NmtError, match=r"^lenpen=nan: not a finite number"):
        translator.score(texts[:1], texts[:1], lenpen=float("nan"))
    built = Translator.from_checkpoint(checkpoint, device="cpu", lenpen=0.5)
    assert translator.score(texts, texts, lenpen=0.5) == built.score(texts, texts)


def test_importing_nmt_is_cheap():
    code = (
        "import sys, nmt, nmt.data.config; assert 'torch' not in sys.modules, 'torch'; "
        "from nmt import Translator; assert 'torch' in sys.modules; "
        "assert Translator.__module__ == 'nmt.generation.translator'"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        import nmt

        _ = nmt.Nothing  # noqa: B018


def test_padding_in_prefix_rows_means_free(translator, texts):
    """translate_ids: a prefix of None, of [] and no prefixes at all are the same."""
    ids = [translator.src_tokenizer.encode(normalize_text(t, False)) + [EOS] for t in texts[:3]]
    free = translator.translate_ids(ids)
    for prefixes in ([None, None, None], [[], [], []]):
        got = translator.translate_ids(ids, prefixes=prefixes)
        assert [[h.tokens.tolist() for h in x] for x in got] == [
            [h.tokens.tolist() for h in x] for x in free
        ]
    assert PAD not in [t for x in free for h in x for t in h.tokens.tolist()]
