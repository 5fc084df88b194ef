"""Generation on a CUDA device: cached decoding equals full decoding, GPU equals CPU,
at most one host sync per decoding step, CTranslate2's CUDA build agrees (issue 20)."""

from __future__ import annotations

import warnings

import pytest
import torch

from nmt.generation.config import SearchConfig
from nmt.generation.generator import SequenceGenerator
from nmt.generation.translator import Translator

pytestmark = pytest.mark.gpu

SENTENCES = [
    "Two young men are playing football on a field.",
    "A woman in a red coat is walking her dog.",
    "A child is eating an ice cream.",
    "Three people sit on a bench in the park near the river.",
]


def _translator(checkpoint, device, precision="fp32", **search):
    return Translator.from_checkpoint(checkpoint, device=device, precision=precision, **search)


@pytest.mark.parametrize("beam", [1, 4])
def test_cached_decoding_equals_full_decoding_on_cuda(trained_checkpoint, beam):
    cached = _translator(trained_checkpoint, "cuda", beam=beam, nbest=beam)
    full = _translator(trained_checkpoint, "cuda", beam=beam, nbest=beam, use_cache=False)
    a = cached.translate_batch(SENTENCES, return_scores=True)
    b = full.translate_batch(SENTENCES, return_scores=True)
    for x, y in zip(a, b):
        assert [t.pieces for t in x] == [t.pieces for t in y]
        assert [t.score for t in x] == pytest.approx([t.score for t in y], abs=1e-4)


def test_cuda_translates_as_the_cpu_does(trained_checkpoint):
    on_cpu = _translator(trained_checkpoint, "cpu", beam=4).translate(SENTENCES)
    on_gpu = _translator(trained_checkpoint, "cuda", beam=4).translate(SENTENCES)
    assert on_gpu == on_cpu
    for precision in ("bf16", "fp16"):
        half = _translator(trained_checkpoint, "cuda", precision, beam=4).translate(SENTENCES)
        assert len(half) == len(SENTENCES) and any(half)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_half_precision_translation_on_cuda_keeps_attention_off_cudnn(
    trained_checkpoint, precision
):
    """cuDNN's attention plans each new shape on the host: on an H100 it made bf16 beam
    search 4x slower than without it (runtime.disable_cudnn_attention). A Translator on a
    GPU leaves SDPA its flash and memory-efficient kernels, and translates as before."""
    torch.backends.cuda.enable_cudnn_sdp(True)
    translator = _translator(trained_checkpoint, "cuda", precision, beam=4)
    assert not torch.backends.cuda.cudnn_sdp_enabled()
    assert torch.backends.cuda.flash_sdp_enabled()
    assert all(translator.translate(SENTENCES))


@pytest.mark.parametrize("precision,dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_half_precision_on_cuda_casts_the_weights_once(trained_checkpoint, precision, dtype):
    """The weights are cast once and decoding runs without autocast (its casts around
    every layer norm and softmax cost bf16 beam search up to 1.5x its time on an H200); the
    trained model still translates most sentences as fp32 does."""
    half = _translator(trained_checkpoint, "cuda", precision, beam=4)
    assert {p.dtype for p in half.models[0].parameters()} == {dtype}
    seen: set[bool] = set()
    hook = half.models[0].decoder.register_forward_pre_hook(
        lambda *_: seen.add(torch.is_autocast_enabled("cuda"))
    )
    try:
        out = half.translate(SENTENCES)
    finally:
        hook.remove()
    assert seen == {False}
    full = _translator(trained_checkpoint, "cuda", beam=4).translate(SENTENCES)
    assert sum(a == b for a, b in zip(out, full)) >= len(SENTENCES) // 2


def test_a_decoding_step_synchronizes_at_most_once(trained_checkpoint):
    """Sync warnings of torch's sync debug mode, counted over two length limits: their
    difference is the steps' (the batch's own reads are the same in both)."""
    translator = _translator(trained_checkpoint, "cuda", beam=4)
    model = translator.models[0]
    src = torch.randint(4, 100, (16, 12), device="cuda")
    src[:, -1] = 2

    def syncs(max_len: int) -> int:
        generator = SequenceGenerator(
            [model], SearchConfig(beam=4, max_len_a=0, max_len_b=max_len, min_len=max_len)
        )
        generator.generate(src)  # warm-up
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                generator.generate(src)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        return sum("synchronizing" in str(w.message) for w in caught)

    assert syncs(20) - syncs(10) <= 10  # min_len = max_len: every sentence decodes all steps


def test_ctranslate2_cuda_build_translates_as_nmt_does(trained_checkpoint, tmp_path):
    ctranslate2 = pytest.importorskip("ctranslate2")
    if ctranslate2.get_cuda_device_count() == 0:
        pytest.skip("this ctranslate2 is a CPU build")
    from nmt.data.tokenizer import Tokenizer
    from nmt.interop.ctranslate2_export import export_ctranslate2

    export_ctranslate2(trained_checkpoint, tmp_path / "ct2")
    ours = _translator(trained_checkpoint, "cuda", beam=4, min_len=0, max_len_a=0, max_len_b=50)
    want = ours.translate_batch(SENTENCES, return_scores=True)
    tok = Tokenizer.from_file(tmp_path / "ct2" / "spm.model")
    ct2 = ctranslate2.Translator(str(tmp_path / "ct2"), device="cuda", compute_type="float32")
    try:
        ct2.translate_batch([tok.encode_as_pieces(SENTENCES[0])], max_decoding_length=2)
    except RuntimeError as exc:  # e.g. 4.x's libcublas.so.12 beside a CUDA 13 torch
        if "not found or cannot be loaded" not in str(exc):
            raise
        pytest.skip(f"this ctranslate2 cannot run on CUDA here: {exc}")
    got = ct2.translate_batch(
        [tok.encode_as_pieces(s) for s in SENTENCES],
        beam_size=4,
        max_decoding_length=50,
        min_decoding_length=0,
        return_scores=True,
    )
    for ours_hyps, theirs in zip(want, got):
        assert theirs.hypotheses[0] == ours_hyps[0].pieces
        assert theirs.scores[0] == pytest.approx(ours_hyps[0].score, abs=1e-3)
