"""Benchmark nmt-generate against CTranslate2 on the same weights, input, beam and threads.

Exports the checkpoint to CTranslate2 (fp32 and int8), decodes the same length-sorted
batches with nmt's SequenceGenerator (what nmt-generate runs) and with
ctranslate2.Translator, and prints target tokens/s of each (EOS counted, as nmt-generate
counts) with the ratio nmt / CTranslate2 from this one run, plus how many fp32
translations are identical. Tokenization, model loading and warm-up are outside the timing.

    .venv/bin/python scripts/bench_ctranslate2.py --checkpoint runs/demo/checkpoint_best.pt
    .venv/bin/python scripts/bench_ctranslate2.py --checkpoint ckpt.pt --input test.en \
        --beam 5 --threads 2 --max-sentences 64 --profile
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from nmt.checkpoint import load_for_inference
from nmt.data.tokenizer import normalize_text
from nmt.data.vocab import EOS
from nmt.generation.config import SearchConfig
from nmt.generation.generator import SequenceGenerator
from nmt.generation.io import Source, collate, make_batches
from nmt.interop.ctranslate2_export import export_ctranslate2, require_ctranslate2


def timed(fn: Callable[[], int], repeat: int) -> tuple[float, float, int]:
    """Best wall time and best CPU time (all threads of this process) of `repeat` runs of
    fn, which returns the tokens it produced. CPU time is the figure that survives a
    machine shared with other jobs; wall time is what a user waits."""
    wall = cpu = float("inf")
    tokens = 0
    for _ in range(repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        tokens = fn()
        wall = min(wall, time.perf_counter() - w0)
        cpu = min(cpu, time.process_time() - c0)
    return wall, cpu, tokens


def line(name: str, tokens: int, wall: float, cpu: float) -> str:
    return (f"{name:19s} {tokens / wall:8.0f} tokens/s wall ({wall:6.2f} s)  "
            f"{tokens / cpu:8.0f} tokens/CPU-s ({cpu:6.2f} s)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", required=True, help="nmt checkpoint")
    ap.add_argument("--input", default="data/demo/test.en", help="source text, one sentence a line")
    ap.add_argument("--lines", type=int, default=0, help="use the first N lines (0: all)")
    ap.add_argument("--beam", type=int, default=5)
    ap.add_argument("--lenpen", type=float, default=1.0)
    ap.add_argument("--max-len-b", type=int, default=200, help="longest output in tokens")
    ap.add_argument("--max-sentences", type=int, default=64, help="sentences per batch")
    ap.add_argument("--threads", type=int, default=2, help="torch threads = CTranslate2 intra_threads")
    ap.add_argument("--repeat", type=int, default=2, help="timed runs per engine (best is kept)")
    ap.add_argument("--profile", action="store_true", help="also print where nmt's time goes")
    args = ap.parse_args()
    ct2 = require_ctranslate2()
    torch.set_num_threads(args.threads)

    bundle = load_for_inference(args.checkpoint, "cpu")
    tok = bundle.src_tokenizer
    nfkc = bool(bundle.data.get("normalization", {}).get("nfkc", False))
    with open(args.input, encoding="utf-8") as f:
        lines = [normalize_text(line, nfkc) for line in f]
    lines = lines[: args.lines] if args.lines else lines
    sources = [Source(i, np.array(tok.encode(t) + [EOS], dtype=np.int64), t) for i, t in enumerate(lines)]
    batches = make_batches(sources, 0, args.max_sentences)
    pieces = {s.index: tok.encode_as_pieces(s.text) for s in sources}

    search = SearchConfig(beam=args.beam, lenpen=args.lenpen, max_len_a=0.0, max_len_b=args.max_len_b)
    generator = SequenceGenerator([bundle.model], search)
    nmt_out: dict[int, list[int]] = {}

    def run_nmt() -> int:
        n = 0
        for batch in batches:
            for s, hyps in zip(batch, generator.generate(collate(batch, torch.device("cpu")))):
                nmt_out[s.index] = hyps[0].tokens.tolist()
                n += len(hyps[0].tokens)
        return n

    run_nmt()  # warm-up
    nmt_wall, nmt_cpu, nmt_tokens = timed(run_nmt, args.repeat)
    print(f"sentences {len(sources)}, batches {len(batches)} (<= {args.max_sentences} sentences), "
          f"beam {args.beam}, lenpen {args.lenpen}, threads {args.threads}, torch {torch.__version__}, "
          f"ctranslate2 {ct2.__version__}")
    print(line("nmt fp32", nmt_tokens, nmt_wall, nmt_cpu))

    import sentencepiece as spm

    tgt = spm.SentencePieceProcessor(model_proto=bundle.tgt_tokenizer.model_bytes)
    with tempfile.TemporaryDirectory() as tmp:
        for quantization, compute_type in (("none", "float32"), ("int8", "int8")):
            out = Path(tmp) / quantization
            export_ctranslate2(args.checkpoint, out, quantization)
            translator = ct2.Translator(str(out), device="cpu", compute_type=compute_type,
                                        intra_threads=args.threads, inter_threads=1)
            ct2_out: dict[int, list[str]] = {}

            def run_ct2() -> int:
                n = 0
                for batch in batches:
                    results = translator.translate_batch(
                        [pieces[s.index] for s in batch], beam_size=args.beam,
                        length_penalty=args.lenpen, max_decoding_length=args.max_len_b,
                        max_batch_size=0)
                    for s, r in zip(batch, results):
                        ct2_out[s.index] = r.hypotheses[0]
                        n += len(r.hypotheses[0]) + 1  # + EOS, which CTranslate2 does not return
                return n

            run_ct2()  # warm-up
            ct2_wall, ct2_cpu, ct2_tokens = timed(run_ct2, args.repeat)
            same = sum(ct2_out[i] == [tgt.id_to_piece(t) for t in nmt_out[i] if t != EOS]
                       for i in nmt_out)
            print(line(f"ctranslate2 {compute_type}", ct2_tokens, ct2_wall, ct2_cpu))
            print(f"    nmt/ctranslate2 {compute_type}: {(nmt_tokens / nmt_wall) / (ct2_tokens / ct2_wall):.2f}x "
                  f"wall, {(nmt_tokens / nmt_cpu) / (ct2_tokens / ct2_cpu):.2f}x CPU; identical "
                  f"translations {same}/{len(nmt_out)}")

    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            run_nmt()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


if __name__ == "__main__":
    main()
