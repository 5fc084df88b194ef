"""nmt against CTranslate2 on the same weights, input, searches and threads, paired.

Six engines translate the same length-sorted batches: nmt fp32, nmt int8 and nmt int8
with a shortlist (what nmt-generate runs: Translator.from_checkpoint with precision= and shortlist=)
against CTranslate2 float32, int8 and int8 with the same shortlist as its vocabulary map
(the checkpoint exported by nmt-export, vmap= for the last). For every search (--beams)
and thread count (--threads) the engines take turns (common.interleave: a balanced order,
--turns times), so the machine's drift hits them alike; each turn is timed in wall and
CPU seconds (this process, all threads). Reported per engine: sentences and target tokens
per second and per CPU-second, BLEU against --ref, how many translations equal nmt
fp32's; per nmt engine, its speed over its CTranslate2 counterpart's with a 95% bootstrap
interval over the turns (> 1: nmt is faster). Tokenization, loading and a warm-up batch
are outside the timing; OpenMP threads wait passively (common.main's `passive`).

With `--device cuda` (a CUDA build of torch and of ctranslate2) nmt in `--precision`
(fp32, bf16 or fp16) runs against CTranslate2 float32 and float16, each clock read after
torch.cuda.synchronize, e.g. issue 20's comparison:

    .venv/bin/python -m benchmarks.ctranslate2 --checkpoint ckpt.pt --input test.en \\
        --device cuda --precision fp16 --beams 4 --threads 1 --max-sentences 128

On the CPU `--precision` is the precision of nmt's float engine (fp32 or bf16), which
the int8 engines join; the translations of every engine are compared with that one's.

    .venv/bin/python -m benchmarks.ctranslate2 --checkpoint runs/m30k/checkpoint_avg_last5.pt \\
        --input ../shared/data/multi30k/test_2016_flickr.en \\
        --ref ../shared/data/multi30k/test_2016_flickr.de \\
        --shortlist data-bin/multi30k/shortlist.txt --beams 5 1 --threads 1 2 --turns 3
    .venv/bin/python -m benchmarks.ctranslate2 --preset small --spm work/bench/data-bin/spm.model \\
        --input ../shared/data/multi30k/test_2016_flickr.en --lines 256 --max-len-b 30

--preset benchmarks a random model of a configs/model preset instead of a trained one:
speed depends on shapes, not on weight values. Its output layer never chooses </s>, so
every sentence is decoded to exactly --max-len-b tokens; nmt then runs one more step that
forces </s>, CTranslate2 stops without it, and both are credited --max-len-b + 1 tokens.
Without --shortlist the two shortlist engines are left out.

nmt's int8 engines multiply on the GEMMs nmt.model.quantize.int8_gemm chooses (oneDNN's
for the output layer on CPUs with VNNI, fbgemm's for the rest); "nmt int8 fbgemm" and
"nmt int8+shortlist fbgemm" (in --engines) run every layer on fbgemm's, for a paired
comparison. nmt fp32 multiplies on the GEMM nmt.model.packed.fp32_gemm chooses (oneDNN's
on non-Intel CPUs with AVX-512, torch's elsewhere); "nmt fp32 torch" and "nmt fp32 onednn"
name one.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast
from unittest.mock import patch

import numpy as np
import torch

from benchmarks import common
from nmt.data.tokenizer import normalize_text
from nmt.generation.config import SearchConfig
from nmt.generation.io import Source, make_batches
from nmt.generation.loading import load_for_inference
from nmt.generation.translator import Translator
from nmt.model.packed import FP32_GEMM_ENV
from nmt.model.quantize import GEMM_ENV
from nmt.vocab import EOS

NAME = "ctranslate2"

# name -> (engine, nmt precision or CTranslate2 compute type, shortlist / vmap)
ENGINES = {
    "nmt fp32": ("nmt", "fp32", False),
    "nmt fp32 torch": ("nmt", "fp32", False),
    "nmt fp32 onednn": ("nmt", "fp32", False),
    "nmt bf16": ("nmt", "bf16", False),
    "nmt fp16": ("nmt", "fp16", False),
    "nmt int8": ("nmt", "int8", False),
    "nmt int8+shortlist": ("nmt", "int8", True),
    "nmt int8 fbgemm": ("nmt", "int8", False),
    "nmt int8+shortlist fbgemm": ("nmt", "int8", True),
    "ctranslate2 float32": ("ctranslate2", "float32", False),
    "ctranslate2 float16": ("ctranslate2", "float16", False),
    "ctranslate2 int8": ("ctranslate2", "int8", False),
    "ctranslate2 int8+vmap": ("ctranslate2", "int8", True),
}
# the engines run when --engines is not given; "nmt {precision}" is nmt's float engine
DEFAULT_ENGINES = {
    "cpu": (
        "nmt {precision}",
        "nmt int8",
        "nmt int8+shortlist",
        "ctranslate2 float32",
        "ctranslate2 int8",
        "ctranslate2 int8+vmap",
    ),
    "cuda": ("nmt {precision}", "ctranslate2 float32", "ctranslate2 float16"),
}
NMT_GEMM = {  # nmt engines on a named GEMM (the others: int8_gemm()'s or fp32_gemm()'s choice)
    "nmt int8 fbgemm": (GEMM_ENV, "fbgemm"),
    "nmt int8+shortlist fbgemm": (GEMM_ENV, "fbgemm"),
    "nmt fp32 torch": (FP32_GEMM_ENV, "torch"),
    "nmt fp32 onednn": (FP32_GEMM_ENV, "onednn"),
}
ONLY_ON = {  # precisions and compute types that run on one device only
    "int8": "cpu",  # nmt's int8 is fbgemm's (x86 CPUs)
    "fp16": "cuda",
    "float16": "cuda",
}
PEERS = {  # each nmt engine against its CTranslate2 counterpart: the first one run
    "nmt fp32": ("ctranslate2 float32",),
    "nmt fp32 torch": ("ctranslate2 float32",),
    "nmt fp32 onednn": ("ctranslate2 float32",),
    "nmt bf16": ("ctranslate2 float16", "ctranslate2 float32"),
    "nmt fp16": ("ctranslate2 float16",),
    "nmt int8": ("ctranslate2 int8",),
    "nmt int8+shortlist": ("ctranslate2 int8+vmap",),
    "nmt int8 fbgemm": ("ctranslate2 int8",),
    "nmt int8+shortlist fbgemm": ("ctranslate2 int8+vmap",),
}

Output = tuple[list[str], int]  # translations in input order, target tokens (</s> counted)
Run = Callable[[int, int], Output]  # (beam, threads) -> Output


@dataclass
class Result:
    """One engine at one setting: its turns and what it translated."""

    timings: list[common.Timing] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    tokens: int = 0


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
    from nmt.model.transformer import Transformer
    from nmt.vocab import BOS, PAD, SPECIAL_IDS

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
        "--ref", type=common.existing_file, help="reference translations: BLEU per engine"
    )
    ap.add_argument(
        "--shortlist",
        type=common.existing_file,
        help="shortlist file (nmt-shortlist): nmt's shortlist= and CTranslate2's vmap",
    )
    ap.add_argument(
        "--lines", type=common.nonnegative_int, default=0, help="use the first N lines (0: all)"
    )
    ap.add_argument(
        "--beams",
        type=common.positive_int,
        nargs="+",
        default=[5, 1],
        help="beam sizes to run (1: greedy)",
    )
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
        nargs="+",
        default=[1, 2],
        help="thread counts to run: torch threads = CTranslate2 intra_threads",
    )
    ap.add_argument(
        "--engines",
        nargs="+",
        choices=list(ENGINES),
        metavar="ENGINE",
        help=f"run only these (default: all of {', '.join(repr(e) for e in ENGINES)})",
    )
    ap.add_argument(
        "--turns", type=common.positive_int, default=3, help="timed runs of every engine"
    )
    ap.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="where all engines run (cuda: nmt against CTranslate2 float32 and float16)",
    )
    ap.add_argument(
        "--precision",
        choices=["fp32", "bf16", "fp16"],
        default="fp32",
        help="nmt's float engine (fp16 needs --device cuda)",
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help="also print where each nmt engine's time goes (first beam and thread count)",
    )
    return ap


def engine_names(args: argparse.Namespace) -> list[str]:
    """The engines to run: --engines or the device's defaults, each checked against it."""
    if args.precision == "fp16" and args.device != "cuda":
        raise common.BenchError("--precision fp16: needs --device cuda; use fp32 or bf16")
    defaults = [n.format(precision=args.precision) for n in DEFAULT_ENGINES[args.device]]
    names = list(args.engines or defaults)
    for name in names:
        device = ONLY_ON.get(ENGINES[name][1], args.device)
        if device != args.device:
            raise common.BenchError(
                f"--engines {name!r}: runs on --device {device} only; leave it out"
            )
    names = [n for n in names if args.shortlist is not None or not ENGINES[n][2]]
    if not names:
        raise common.BenchError("--engines: the shortlist engines need --shortlist FILE")
    return names


def _batches(args: argparse.Namespace, checkpoint: str) -> tuple[Any, list[list[Source]]]:
    """The checkpoint's bundle and the input as length-sorted batches of Sources."""
    with open(args.input, encoding="utf-8") as f:
        lines = [normalize_text(line, False) for line in f]
    lines = lines[: args.lines] if args.lines else lines
    bundle = load_for_inference(checkpoint, "cpu")
    if bundle.data.get("normalization", {}).get("nfkc", False):
        lines = [normalize_text(t, True) for t in lines]
    tok = bundle.src_tokenizer
    sources = [
        Source(i, np.array(tok.encode(t) + [EOS], dtype=np.int64), t) for i, t in enumerate(lines)
    ]
    return bundle, make_batches(sources, 0, args.max_sentences)


def nmt_engine(
    checkpoint: str,
    precision: str,
    shortlist: Path | None,
    args: argparse.Namespace,
    batches: list[list[Source]],
    gemm: tuple[str, str] | None = None,
) -> Run:
    """nmt-generate's Translator with `precision` (and `shortlist`), one search per beam;
    `gemm` (an environment variable and its value, NMT_GEMM's) names the GEMM of the
    layers (int8 or packed fp32, made at load) instead of nmt's choice."""

    def search(beam: int) -> SearchConfig:
        return SearchConfig(beam=beam, lenpen=args.lenpen, max_len_a=0.0, max_len_b=args.max_len_b)

    # (patch.dict restores the environment as it was)
    with patch.dict(os.environ, dict([gemm]) if gemm else {}):
        base = Translator.from_checkpoint(  # exact fp32 (no TF32) on a GPU, as nmt-generate
            checkpoint,
            search=search(args.beams[0]),
            device=args.device,
            precision=precision,
            max_sentences=args.max_sentences,
            shortlist=shortlist,
        )
    translators = {beam: base.with_search(search(beam)) for beam in args.beams}
    total = sum(len(b) for b in batches)

    def run(beam: int, threads: int) -> Output:
        torch.set_num_threads(threads)
        texts, tokens = [""] * total, 0
        translator = translators[beam]
        for batch in batches:  # one call per batch: CTranslate2 gets the same batches
            for s, hyps in zip(batch, translator.translate_ids([s.ids for s in batch])):
                texts[s.index] = translator.tgt_tokenizer.decode(hyps[0].tokens)
                tokens += len(hyps[0].tokens)
        return texts, tokens

    return run


def ct2_engine(
    model_dir: Path,
    compute_type: str,
    vmap: bool,
    args: argparse.Namespace,
    batches: list[list[Source]],
    pieces: dict[int, list[str]],
    decode: Callable[[list[str]], str],
) -> Run:
    """ctranslate2.Translator on the exported model, one per thread count."""
    import ctranslate2

    translators = {
        t: ctranslate2.Translator(
            str(model_dir),
            device=args.device,
            compute_type=compute_type,
            intra_threads=t,
            inter_threads=1,
        )
        for t in args.threads
    }
    total = sum(len(b) for b in batches)

    def run(beam: int, threads: int) -> Output:
        texts, tokens = [""] * total, 0
        for batch in batches:
            try:
                results = translators[threads].translate_batch(
                    [pieces[s.index] for s in batch],
                    beam_size=beam,
                    length_penalty=args.lenpen,
                    max_decoding_length=args.max_len_b,
                    max_batch_size=0,
                    use_vmap=vmap,
                )
            except RuntimeError as exc:  # 4.x opens libcublas.so.12: a CUDA 13 system lacks it
                if "not found or cannot be loaded" not in str(exc):
                    raise
                raise common.BenchError(f"--device {args.device}: ctranslate2: {exc}") from None
            for s, r in zip(batch, results):
                texts[s.index] = decode(r.hypotheses[0])
                tokens += len(r.hypotheses[0]) + 1  # + </s>, which CTranslate2 does not return
        return texts, tokens

    return run


def run(args: argparse.Namespace) -> dict[str, Any]:
    from nmt.interop.ctranslate2_export import require_ctranslate2

    if bool(args.checkpoint) == bool(args.preset) or bool(args.preset) != bool(args.spm):
        raise common.BenchError("give --checkpoint, or --preset with --spm")
    if args.checkpoint and not Path(args.checkpoint).is_file():
        raise common.BenchError(f"--checkpoint {args.checkpoint}: no such file")
    ct2 = require_ctranslate2()
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise common.BenchError("--device cuda: torch sees no CUDA device; use --device cpu")
    if cuda and ct2.get_cuda_device_count() == 0:
        raise common.BenchError(
            f"--device cuda: this ctranslate2 ({ct2.__version__}) sees no CUDA device"
        )
    names = engine_names(args)
    device = torch.cuda.get_device_name(0) if cuda else common.cpu_model()
    sync = torch.cuda.synchronize if cuda else None
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = args.checkpoint or str(
            random_checkpoint(args.preset, args.spm, Path(tmp) / "random.pt")
        )
        bundle, batches = _batches(args, checkpoint)
        refs = None
        if args.ref is not None:
            refs = args.ref.read_text(encoding="utf-8").splitlines()
            n = sum(len(b) for b in batches)
            if len(refs) < n:
                raise common.BenchError(f"--ref {args.ref}: {len(refs)} lines for {n} inputs")
            refs = refs[:n]
        engines = _engines(names, args, checkpoint, bundle, batches, Path(tmp))
        where = device if cuda else f"CPU: {device}"
        _describe(args, checkpoint, bundle, batches, names, f"{ct2.__version__}, {where}")
        settings = []
        for beam in args.beams:
            for threads in args.threads:
                settings.append(_setting(beam, threads, names, engines, args.turns, refs, sync))
        if args.profile:
            _profile(args, names, engines)
    figures: dict[str, Any] = {
        "model": args.preset or args.checkpoint,
        "sentences": sum(len(b) for b in batches),
        "batches": len(batches),
        "lenpen": args.lenpen,
        "max_len_b": args.max_len_b,
        "device": device,
        "precision": args.precision,
        "turns": args.turns,
        "shortlist": None if args.shortlist is None else str(args.shortlist),
        "ctranslate2": ct2.__version__,
        "settings": settings,
    }
    return figures


def _engines(
    names: Sequence[str],
    args: argparse.Namespace,
    checkpoint: str,
    bundle: Any,
    batches: list[list[Source]],
    tmp: Path,
) -> dict[str, Run]:
    """Load every engine (exporting the CTranslate2 models it needs)."""
    import sentencepiece as spm

    from nmt.interop.ctranslate2_export import export_ctranslate2

    src = bundle.src_tokenizer
    pieces = {s.index: src.encode_as_pieces(s.text) for batch in batches for s in batch}
    tgt = spm.SentencePieceProcessor(model_proto=bundle.tgt_tokenizer.model_bytes)
    engines: dict[str, Run] = {}
    for name in names:
        kind, precision, reduced = ENGINES[name]
        if kind == "nmt":
            shortlist = args.shortlist if reduced else None
            gemm = NMT_GEMM.get(name)
            engines[name] = nmt_engine(checkpoint, precision, shortlist, args, batches, gemm)
            continue
        # float16 is a compute type of the float32 export (GPU); int8 an export of its own
        quantization = "int8" if precision == "int8" else "none"
        out = tmp / f"{quantization}{'-vmap' if reduced else ''}"
        if not out.exists():
            vmap = args.shortlist if reduced else None
            export_ctranslate2(checkpoint, out, quantization, vmap=vmap)
        engines[name] = ct2_engine(out, precision, reduced, args, batches, pieces, tgt.decode)
    return engines


def _describe(
    args: argparse.Namespace,
    checkpoint: str,
    bundle: Any,
    batches: list[list[Source]],
    names: Sequence[str],
    version: str,
) -> None:
    cfg = bundle.model_config
    print(
        f"model: {args.preset or checkpoint}: {cfg.encoder_layers}+{cfg.decoder_layers} "
        f"layers, {cfg.embed_dim} dim, {cfg.ffn_dim} FFN, vocab {bundle.data['tgt_vocab_size']}"
    )
    print(
        f"sentences {sum(len(b) for b in batches)}, batches {len(batches)} (<= "
        f"{args.max_sentences} sentences), lenpen {args.lenpen}, torch {torch.__version__}, "
        f"ctranslate2 {version}; engines: {', '.join(names)}; {args.turns} turns each"
    )


def _setting(
    beam: int,
    threads: int,
    names: Sequence[str],
    engines: dict[str, Run],
    turns: int,
    refs: list[str] | None,
    sync: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Every engine at one beam and thread count, interleaved; figures and a table.
    `sync`: see common.timed (torch.cuda.synchronize on a GPU)."""
    results = {name: Result() for name in names}

    def contestant(name: str) -> Callable[[int], None]:
        def turn(_: int) -> None:
            results[name].texts, results[name].tokens = engines[name](beam, threads)

        return turn

    for name in names:  # warm-up: weights paged in, buffers allocated, threads started
        engines[name](beam, threads)
    timings = common.interleave([contestant(n) for n in names], turns, sync=sync)
    for name, t in zip(names, timings):
        results[name].timings = t
    sentences = len(results[names[0]].texts)
    # every engine's translations against nmt's float engine (the first nmt one not int8)
    ref_name = next((n for n in names if ENGINES[n][0] == "nmt" and ENGINES[n][1] != "int8"), None)
    reference = None if ref_name is None else results[ref_name]
    figures: dict[str, Any] = {
        "beam": beam,
        "threads": threads,
        "reference": ref_name,
        "engines": {},
        "ratios": {},
    }
    rows = []
    for name in names:
        r = results[name]
        wall = sum(t.wall for t in r.timings) / turns
        cpu = sum(t.cpu for t in r.timings) / turns
        bleu = None
        if refs is not None:
            from nmt.scoring import corpus_bleu

            bleu = corpus_bleu(r.texts, [refs]).score
        same = None if reference is None else sum(a == b for a, b in zip(r.texts, reference.texts))
        figures["engines"][name] = {
            "sentences_per_s": sentences / wall,
            "sentences_per_cpu_s": sentences / cpu,
            "tokens_per_s": r.tokens / wall,
            "tokens": r.tokens,
            "wall": wall,
            "cpu": cpu,
            "bleu": bleu,
            "same_as_reference": same,
        }
        ratio = ""
        peer = next((p for p in PEERS.get(name, ()) if p in results), None)
        if peer is not None:
            paired = common.paired_ratios(results[peer].timings, r.timings)
            figures["ratios"][name] = {"peer": peer, **paired}
            ratio = f"{paired['wall'].ratio:.2f}x / {paired['cpu'].ratio:.2f}x"
            ratio += f" (CPU ±{paired['cpu'].noise:.2f})"
        rows.append(
            [
                name,
                f"{sentences / wall:,.1f}",
                f"{sentences / cpu:,.1f}",
                f"{r.tokens / wall:,.0f}",
                "-" if bleu is None else f"{bleu:.2f}",
                "-" if same is None else f"{same}/{sentences}",
                ratio,
            ]
        )
    header = [
        f"beam {beam}, {threads} thread{'s' if threads > 1 else ''}",
        "sentences/s",
        "sentences/CPU-s",
        "tokens/s",
        "BLEU",
        f"same as {ref_name or '-'}",
        "nmt / CTranslate2 counterpart (wall / CPU)",
    ]
    print(common.markdown_table(header, rows), flush=True)
    return figures


def _profile(args: argparse.Namespace, names: Sequence[str], engines: dict[str, Run]) -> None:
    beam, threads = args.beams[0], args.threads[0]
    for name in names:
        if ENGINES[name][0] != "nmt":
            continue
        plural = "" if threads == 1 else "s"
        common.print_profile(
            f"where {name}'s time goes (beam {beam}, {threads} thread{plural})",
            name,
            lambda name=name: engines[name](beam, threads),
        )


if __name__ == "__main__":
    raise SystemExit(common.main(NAME, build_parser, run, passive=True))
