"""nmt-generate against CTranslate2 on the same weights, input, beam and threads.

Exports the checkpoint to CTranslate2, decodes the same length-sorted batches with
nmt.Translator (what nmt-generate runs) and with ctranslate2.Translator, and prints target
tokens/s and sentences/s of each (EOS counted, as nmt-generate counts) with the ratio
nmt / CTranslate2 from this one run, plus how many translations are identical.
Tokenization, model loading and warm-up are outside the timing.

On the CPU CTranslate2 runs float32 and int8; with `--device cuda` (a CUDA build of torch
and of ctranslate2) float32 and float16, each clock read after torch.cuda.synchronize,
and nmt in `--precision` (fp32, bf16 or fp16), e.g. issue 20's comparison:

    .venv/bin/python -m benchmarks.ctranslate2 --checkpoint ckpt.pt --input test.en \\
        --device cuda --precision fp16 --beam 4 --max-sentences 128

    .venv/bin/python -m benchmarks.ctranslate2 --checkpoint runs/demo/checkpoint_best.pt
    .venv/bin/python -m benchmarks.ctranslate2 --checkpoint ckpt.pt --input test.en \\
        --beam 5 --threads 2 --max-sentences 64 --profile
    .venv/bin/python -m benchmarks.ctranslate2 --preset small --spm work/bench/data-bin/spm.model \\
        --input ../shared/data/multi30k/test_2016_flickr.en

--preset benchmarks a random model of a configs/model preset instead of a trained one:
speed depends on shapes, not on weight values. Its output layer never chooses </s>, so
every sentence is decoded to exactly --max-len-b tokens; nmt then runs one more step that
forces </s>, CTranslate2 stops without it, and both are credited --max-len-b + 1 tokens.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from benchmarks import common
from nmt.checkpoint import load_for_inference
from nmt.data.tokenizer import normalize_text
from nmt.data.vocab import EOS
from nmt.generation.config import SearchConfig
from nmt.generation.io import Source, make_batches
from nmt.generation.translator import Translator
from nmt.runtime import Runtime

NAME = "ctranslate2"


def timed(
    fn: Callable[[], int], repeat: int, sync: Callable[[], None] | None = None
) -> tuple[float, float, int]:
    """Best wall time and best CPU time (all threads of this process) of `repeat` runs of
    fn, which returns the tokens it produced. CPU time is the figure that survives a
    machine shared with other jobs; wall time is what a user waits. `sync`: see
    common.timed (torch.cuda.synchronize on a GPU)."""
    wall = cpu = float("inf")
    tokens = 0
    for _ in range(repeat):
        with common.timed(sync) as t:
            tokens = fn()
        wall, cpu = min(wall, t.wall), min(cpu, t.cpu)
    return wall, cpu, tokens


def line(name: str, tokens: int, wall: float, cpu: float, sentences: int) -> str:
    wall, cpu = max(wall, 1e-9), max(cpu, 1e-9)
    return (
        f"{name:19s} {tokens / wall:8.0f} tokens/s wall ({wall:6.2f} s, "
        f"{sentences / wall:7.1f} sentences/s)  {tokens / cpu:8.0f} tokens/CPU-s ({cpu:6.2f} s)"
    )


# CTranslate2's (quantization at export, compute_type at load) per device: float32 is
# compared with nmt's fp32 for identical translations, the others for speed.
CT2_TYPES = {
    "cpu": (("none", "float32"), ("int8", "int8")),
    "cuda": (("none", "float32"), ("none", "float16")),
}


def random_checkpoint(preset: str, spm_path: str | Path, out: Path) -> Path:
    """A random `preset` model with the spm model as both tokenizers, saved to `out`.

    One hidden feature is made constant 1 and the output layer reads it as a bias of -100
    for <pad>, <s> and </s>: translations never end early, every sentence is decoded to
    the length limit, and both engines run the same number of steps on the same shapes.
    """
    from dataclasses import asdict

    from benchmarks.decoder import load_preset
    from nmt.checkpoint import build_checkpoint, save_checkpoint
    from nmt.data.tokenizer import Tokenizer
    from nmt.data.vocab import BOS, PAD, SPECIAL_IDS
    from nmt.model.transformer import Transformer

    cfg = load_preset(preset)
    if not Path(spm_path).is_file():
        raise common.BenchError(f"--spm {spm_path}: no such file")
    tok = Tokenizer.from_file(spm_path)
    tok.check_special_ids(str(spm_path))
    torch.manual_seed(0)
    model = Transformer(cfg, tok.vocab_size, tok.vocab_size).eval()
    dec = model.decoder
    last = cast(torch.nn.Module, dec.layers[-1])
    norm = cast(
        torch.nn.LayerNorm, dec.layer_norm if cfg.normalize_before else last.final_layer_norm
    )
    weight = dec.output_projection.weight  # [V,D]
    with torch.no_grad():
        norm.weight[0], norm.bias[0] = 0.0, 1.0
        weight[:, 0] = 0.0
        weight[[PAD, BOS, EOS], 0] = -100.0
    data = {
        "src_lang": "src",
        "tgt_lang": "tgt",
        "src_vocab_size": tok.vocab_size,
        "tgt_vocab_size": tok.vocab_size,
        "joint_vocab": True,
        "special_ids": dict(SPECIAL_IDS),
        "normalization": {"nfkc": False},
    }
    save_checkpoint(
        build_checkpoint(
            model_state=model.state_dict(),
            model_config=asdict(cfg),
            data=data,
            src_tokenizer=tok.model_bytes,
            tgt_tokenizer=tok.model_bytes,
        ),
        out,
    )
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = common.parser(NAME, __doc__)
    ap.add_argument("--checkpoint", help="nmt checkpoint (or --preset and --spm)")
    ap.add_argument(
        "--preset", help="benchmark a random configs/model preset (tiny, small, base, ...)"
    )
    ap.add_argument(
        "--spm", help="with --preset: the SentencePiece model (nmt's ids) for both sides"
    )
    ap.add_argument(
        "--input",
        type=common.existing_file,
        default="data/demo/test.en",
        help="source text, one sentence a line",
    )
    ap.add_argument(
        "--lines", type=common.nonnegative_int, default=0, help="use the first N lines (0: all)"
    )
    ap.add_argument("--beam", type=common.positive_int, default=5)
    ap.add_argument("--lenpen", type=float, default=1.0)
    ap.add_argument(
        "--max-len-b",
        type=int,
        default=200,
        help="longest output in tokens (with --preset: every output's length)",
    )
    ap.add_argument(
        "--max-sentences", type=common.positive_int, default=64, help="sentences per batch"
    )
    ap.add_argument(
        "--threads",
        type=common.positive_int,
        default=2,
        help="torch threads = CTranslate2 intra_threads",
    )
    ap.add_argument(
        "--repeat", type=common.positive_int, default=2, help="timed runs per engine (best is kept)"
    )
    ap.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="where both engines run (cuda: CTranslate2 float32 and float16)",
    )
    ap.add_argument(
        "--precision",
        choices=["fp32", "bf16", "fp16"],
        default="fp32",
        help="nmt's precision (fp16 needs --device cuda)",
    )
    ap.add_argument("--profile", action="store_true", help="also print where nmt's time goes")
    return ap


def run(args: argparse.Namespace) -> dict[str, Any]:
    from nmt.interop.ctranslate2_export import export_ctranslate2, require_ctranslate2

    if bool(args.checkpoint) == bool(args.preset) or bool(args.preset) != bool(args.spm):
        raise common.BenchError("give --checkpoint, or --preset with --spm")
    if args.checkpoint and not Path(args.checkpoint).is_file():
        raise common.BenchError(f"--checkpoint {args.checkpoint}: no such file")
    search = SearchConfig(
        beam=args.beam, lenpen=args.lenpen, max_len_a=0.0, max_len_b=args.max_len_b
    )
    ct2 = require_ctranslate2()
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise common.BenchError("--device cuda: torch sees no CUDA device; use --device cpu")
    if cuda and ct2.get_cuda_device_count() == 0:
        raise common.BenchError(
            f"--device cuda: this ctranslate2 ({ct2.__version__}) sees no CUDA device"
        )
    if args.precision == "fp16" and not cuda:
        raise common.BenchError("--precision fp16: needs --device cuda; use fp32 or bf16")
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if cuda else None
    torch.set_num_threads(args.threads)
    tmp = tempfile.TemporaryDirectory()
    with open(args.input, encoding="utf-8") as f:
        lines = [normalize_text(line, False) for line in f]
    lines = lines[: args.lines] if args.lines else lines
    if args.preset:
        args.checkpoint = str(
            random_checkpoint(args.preset, args.spm, Path(tmp.name) / "random.pt")
        )

    bundle = load_for_inference(args.checkpoint, device)
    tok = bundle.src_tokenizer
    if bundle.data.get("normalization", {}).get("nfkc", False):
        lines = [normalize_text(t, True) for t in lines]
    sources = [
        Source(i, np.array(tok.encode(t) + [EOS], dtype=np.int64), t) for i, t in enumerate(lines)
    ]
    batches = make_batches(sources, 0, args.max_sentences)
    pieces = {s.index: tok.encode_as_pieces(s.text) for s in sources}

    translator = Translator(
        [cast(Any, bundle.model)],
        bundle.src_tokenizer,
        bundle.tgt_tokenizer,
        search=search,
        runtime=Runtime(device, args.precision),  # exact fp32: no TF32, as nmt-generate
        max_sentences=args.max_sentences,
    )
    nmt_out: dict[int, list[int]] = {}

    def run_nmt() -> int:
        n = 0
        for batch in batches:  # one call per batch: CTranslate2 gets the same batches
            for s, hyps in zip(batch, translator.translate_ids([s.ids for s in batch])):
                nmt_out[s.index] = hyps[0].tokens.tolist()
                n += len(hyps[0].tokens)
        return n

    run_nmt()  # warm-up
    nmt_wall, nmt_cpu, nmt_tokens = timed(run_nmt, args.repeat, sync)
    cfg = bundle.model_config
    print(
        f"model: {args.preset or args.checkpoint}: {cfg.encoder_layers}+{cfg.decoder_layers} layers, "
        f"{cfg.embed_dim} dim, {cfg.ffn_dim} FFN, vocab {bundle.data['tgt_vocab_size']}"
    )
    print(
        f"sentences {len(sources)}, batches {len(batches)} (<= {args.max_sentences} sentences), "
        f"beam {args.beam}, lenpen {args.lenpen}, threads {args.threads}, torch {torch.__version__}, "
        f"ctranslate2 {ct2.__version__}, "
        + (torch.cuda.get_device_name(device) if cuda else f"CPU: {common.cpu_model()}")
    )
    print(
        f"output: {nmt_tokens} target tokens, {nmt_tokens / len(sources):.1f} per sentence (</s> included)"
    )
    print(line(f"nmt {args.precision}", nmt_tokens, nmt_wall, nmt_cpu, len(sources)))
    figures: dict[str, Any] = {
        "model": args.preset or args.checkpoint,
        "sentences": len(sources),
        "batches": len(batches),
        "beam": args.beam,
        "lenpen": args.lenpen,
        "threads": args.threads,
        "device": torch.cuda.get_device_name(device) if cuda else common.cpu_model(),
        "precision": args.precision,
        "ctranslate2": ct2.__version__,
        "nmt": {
            "tokens": nmt_tokens,
            "sentences_per_s": len(sources) / max(nmt_wall, 1e-9),
            "wall": nmt_wall,
            "cpu": nmt_cpu,
        },
    }

    import sentencepiece as spm

    tgt = spm.SentencePieceProcessor(model_proto=bundle.tgt_tokenizer.model_bytes)
    with tmp:
        for quantization, compute_type in CT2_TYPES[args.device]:
            out = Path(tmp.name) / quantization
            if not out.exists():
                export_ctranslate2(args.checkpoint, out, quantization)
            peer = ct2.Translator(
                str(out),
                device=args.device,
                compute_type=compute_type,
                intra_threads=args.threads,
                inter_threads=1,
            )
            ct2_out: dict[int, list[str]] = {}

            def run_ct2(peer=peer, ct2_out=ct2_out) -> int:
                n = 0
                for batch in batches:
                    results = peer.translate_batch(
                        [pieces[s.index] for s in batch],
                        beam_size=args.beam,
                        length_penalty=args.lenpen,
                        max_decoding_length=args.max_len_b,
                        max_batch_size=0,
                    )
                    for s, r in zip(batch, results):
                        ct2_out[s.index] = r.hypotheses[0]
                        n += len(r.hypotheses[0]) + 1  # + EOS, which CTranslate2 does not return
                return n

            try:
                run_ct2()  # warm-up; loads CTranslate2's CUDA libraries on a GPU
            except RuntimeError as exc:  # 4.x opens libcublas.so.12: a CUDA 13 system lacks it
                if "not found or cannot be loaded" not in str(exc):
                    raise
                raise common.BenchError(f"--device {args.device}: ctranslate2: {exc}") from None
            ct2_wall, ct2_cpu, ct2_tokens = timed(run_ct2, args.repeat, sync)
            same = sum(
                ct2_out[i] == [tgt.id_to_piece(t) for t in nmt_out[i] if t != EOS] for i in nmt_out
            )
            print(line(f"ctranslate2 {compute_type}", ct2_tokens, ct2_wall, ct2_cpu, len(sources)))
            wall_ratio = (nmt_tokens * ct2_wall) / max(ct2_tokens * nmt_wall, 1e-9)
            cpu_ratio = (nmt_tokens * ct2_cpu) / max(ct2_tokens * nmt_cpu, 1e-9)
            print(
                f"    nmt/ctranslate2 {compute_type}: {wall_ratio:.2f}x wall, {cpu_ratio:.2f}x "
                f"CPU; identical translations {same}/{len(nmt_out)}"
            )
            figures[f"ctranslate2_{compute_type}"] = {
                "tokens": ct2_tokens,
                "sentences_per_s": len(sources) / max(ct2_wall, 1e-9),
                "wall": ct2_wall,
                "cpu": ct2_cpu,
                "nmt_over_ctranslate2_wall": wall_ratio,
                "nmt_over_ctranslate2_cpu": cpu_ratio,
                "identical_translations": same,
            }

    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            run_nmt()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
    return figures


if __name__ == "__main__":
    raise SystemExit(common.main(NAME, build_parser, run, passive=True))
