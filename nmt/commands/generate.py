"""nmt-generate: translate raw text (a file or stdin) or a binarized split with one
checkpoint or an ensemble; print translations in input order, then throughput (and BLEU
when references are known) on stderr.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from tqdm import tqdm

from nmt.checkpoint import InferenceBundle, load_for_inference
from nmt.data.tokenizer import normalize_text
from nmt.errors import NmtError
from nmt.generation.config import GenerateConfig
from nmt.generation.generator import Hypothesis, SequenceGenerator
from nmt.generation.io import (
    OutputWriter,
    Source,
    SourceEncoder,
    collate,
    count_lines,
    make_batches,
    open_output,
    split_sources,
    text_sources,
)
from nmt.scoring import as_path_list, corpus_bleu


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise NmtError(f"device: {name!r} is not a device; use cpu, cuda, cuda:N or auto") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise NmtError(f"device: {name} requested but CUDA is not available; use device=cpu")
    return device


def autocast(device: torch.device, dtype: str) -> contextlib.AbstractContextManager:
    if dtype == "fp32":
        return contextlib.nullcontext()
    if dtype == "fp16" and device.type != "cuda":
        raise NmtError("dtype: fp16 needs a CUDA device; use bf16 or fp32 on the CPU")
    return torch.autocast(device.type, dtype=torch.bfloat16 if dtype == "bf16" else torch.float16)


def load_models(
    paths: list[str], device: torch.device
) -> tuple[list[torch.nn.Module], InferenceBundle]:
    """Models of every checkpoint; all must share the first one's tokenizers."""
    bundles = [load_for_inference(p, device) for p in paths]
    first = bundles[0]
    for path, b in zip(paths[1:], bundles[1:]):
        for side in ("src", "tgt"):
            mine = getattr(b, f"{side}_tokenizer").model_bytes
            if mine != getattr(first, f"{side}_tokenizer").model_bytes:
                raise NmtError(
                    f"checkpoint {path}: its {side} SentencePiece model differs from {paths[0]}'s; "
                    "an ensemble needs checkpoints trained on the same data dir"
                )
    return [b.model for b in bundles], first


def open_sources(
    cfg: GenerateConfig, bundle: InferenceBundle, encoder: SourceEncoder, chunk: int
) -> tuple[Iterator[list[Source]], int | None]:
    """The input as chunks of Sources, and its length when known (for the progress bar)."""
    if cfg.split is not None:
        from nmt.data.binarize import TokenArray
        from nmt.data.meta import load_meta, split_prefix

        meta = load_meta(cfg.input)
        for side in ("src", "tgt"):
            if meta.tokenizers[side]["sha256"] != getattr(bundle, f"{side}_tokenizer").sha256:
                raise NmtError(
                    f"input {cfg.input}: its {side} SentencePiece model is not the "
                    "checkpoint's; translate a data dir built for this model"
                )
        if cfg.split not in meta.splits:
            raise NmtError(
                f"split: {cfg.split!r} is not in {cfg.input} (it has "
                f"{', '.join(sorted(meta.splits))})"
            )
        src = TokenArray(split_prefix(cfg.input, cfg.split, meta.src_lang))
        tgt_prefix = split_prefix(cfg.input, cfg.split, meta.tgt_lang)
        tgt = TokenArray(tgt_prefix) if Path(f"{tgt_prefix}.bin").is_file() else None
        return (
            split_sources(src, tgt, bundle.src_tokenizer, bundle.tgt_tokenizer, encoder, chunk),
            len(src),
        )
    if cfg.input != "-" and Path(cfg.input).is_dir():
        raise NmtError(
            f"input {cfg.input}: a directory; for a data dir add split=test, "
            "otherwise name a text file"
        )
    total = None
    if cfg.input != "-" and Path(cfg.input).is_file():
        total = count_lines(cfg.input)
        if cfg.ref is not None:
            if not Path(cfg.ref).is_file():
                raise NmtError(f"ref {cfg.ref}: no such file")
            n_ref = count_lines(cfg.ref)
            if n_ref != total:
                raise NmtError(
                    f"ref {cfg.ref}: {n_ref} lines, but input {cfg.input} has {total}; "
                    "they must be line-aligned"
                )
    return text_sources(cfg.input, encoder, chunk, cfg.ref), total


class Translator:
    """Batches a chunk of sources by length, decodes them, returns hypotheses by index."""

    def __init__(
        self,
        generator: SequenceGenerator,
        cfg: GenerateConfig,
        device: torch.device,
        prefix: list[int] | None,
    ):
        self.generator = generator
        self.cfg = cfg
        self.device = device
        self.prefix = prefix

    def __call__(self, chunk: list[Source]) -> dict[int, list[Hypothesis]]:
        out: dict[int, list[Hypothesis]] = {}
        for batch in make_batches(chunk, self.cfg.max_tokens, self.cfg.max_sentences):
            src = collate(batch, self.device)  # [B,S]
            prefix = None
            if self.prefix:
                prefix = torch.tensor(self.prefix, device=self.device).expand(
                    len(batch), -1
                )  # [B,P]
            with autocast(self.device, self.cfg.dtype):
                hyps = self.generator.generate(src, prefix)
            out.update((s.index, h) for s, h in zip(batch, hyps))
        return out


def run(cfg: GenerateConfig) -> None:
    cfg.validate()
    paths = as_path_list(cfg.checkpoint, "checkpoint")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = resolve_device(cfg.device)
    autocast(device, cfg.dtype)  # refuse fp16 on the CPU before loading anything
    models, bundle = load_models(paths, device)
    nfkc = bool(bundle.data.get("normalization", {}).get("nfkc", False))
    max_src = min(m.cfg.max_source_positions for m in models)
    where = (
        "stdin"
        if cfg.input == "-"
        else f"{cfg.input} split {cfg.split}"
        if cfg.split
        else cfg.input
    )
    encoder = SourceEncoder(bundle.src_tokenizer, nfkc, max_src, cfg.overlong, where)
    prefix = None
    if cfg.prefix:
        prefix = bundle.tgt_tokenizer.encode(normalize_text(cfg.prefix, nfkc)) or None
    generator = SequenceGenerator(
        models, cfg, attn_layer=cfg.alignment_layer if cfg.print_alignment else None
    )
    translate = Translator(generator, cfg, device, prefix)
    interactive = cfg.interactive if cfg.interactive is not None else cfg.input == "-"
    chunks, total = open_sources(cfg, bundle, encoder, 1 if interactive else cfg.buffer_size)

    n_sent = n_tokens = 0
    hyps_text: list[str] = []
    refs: list[str] = []
    start = time.perf_counter()
    with (
        open_output(cfg.output) as stream,
        tqdm(
            total=total,
            unit="sent",
            file=sys.stderr,
            dynamic_ncols=True,
            leave=False,
            # None: tqdm's own choice, off when stderr is not a terminal (logs stay clean)
            disable=True if (interactive or not cfg.progress or total is None) else None,
        ) as bar,
    ):
        writer = OutputWriter(
            stream,
            bundle.tgt_tokenizer,
            cfg.format,
            cfg.nbest,
            cfg.print_alignment,
            flush=interactive,
        )
        for chunk in chunks:
            results = translate(chunk)
            for src in chunk:
                hyps = results.get(src.index, [])
                best = writer.write(src, hyps)
                n_tokens += len(hyps[0].tokens) if hyps else 0
                if src.ref is not None:
                    hyps_text.append(best)
                    refs.append(src.ref)
            n_sent += len(chunk)
            bar.update(len(chunk))
    elapsed = max(time.perf_counter() - start, 1e-9)
    print(
        f"nmt-generate: translated {n_sent} sentences ({n_tokens} target tokens) in "
        f"{elapsed:.1f}s: {n_sent / elapsed:.1f} sentences/s, {n_tokens / elapsed:.0f} tokens/s",
        file=sys.stderr,
    )
    if refs and len(refs) == n_sent:
        print(f"nmt-generate: {corpus_bleu(hyps_text, [refs]).line}", file=sys.stderr)
