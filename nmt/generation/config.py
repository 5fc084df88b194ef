"""Configuration of the search (SearchConfig) and of nmt-generate (GenerateConfig).

GenerateConfig extends SearchConfig, so the search options sit at the top level where
fairseq users look for them (`beam=5 lenpen=0.6`), while the generator receives only the
part it uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from nmt.errors import NmtError

FORMATS = ("plain", "fairseq")
DTYPES = ("fp32", "bf16", "fp16")
OVERLONG = ("truncate", "error")


@dataclass
class SearchConfig:
    """Beam search and sampling, with fairseq's option names and semantics."""

    beam: int = 5  # hypotheses kept per sentence; 1 = greedy decoding
    nbest: int = 1  # finished hypotheses returned per sentence (at most beam)
    lenpen: float = 1.0  # final score = sum of log-probs / length**lenpen (length incl. EOS)
    max_len_a: float = 0.0  # longest output: max_len_a * source length + max_len_b tokens
    max_len_b: int = 200  # (capped by the model's max_target_positions - 1)
    min_len: int = 1  # shortest output in tokens, EOS not counted
    unkpen: float = 0.0  # subtracted from <unk>'s log-prob (positive = fewer <unk>)
    no_repeat_ngram_size: int = 0  # forbid repeating any n-gram of this size; 0 = off
    sampling: bool = False  # sample instead of beam search (beam = samples per sentence)
    sampling_topk: int = 0  # sample among the k most likely tokens; 0 = all
    sampling_topp: float = 1.0  # sample from the smallest set with this much mass; 1 = all
    temperature: float = 1.0  # logits are divided by it (< 1 sharper, > 1 flatter)
    seed: int = 1  # random seed for sampling
    use_cache: bool = True  # incremental decoding with a KV cache (false: re-run the prefix; slow)

    def validate(self) -> None:
        """Raise NmtError naming the first key that cannot work."""
        if self.beam < 1:
            raise NmtError(f"beam: {self.beam}; use 1 (greedy) or more")
        if not 1 <= self.nbest <= self.beam:
            raise NmtError(f"nbest: {self.nbest}; it must be between 1 and beam={self.beam}")
        if self.max_len_a < 0 or self.max_len_b < 0:
            raise NmtError("max_len_a, max_len_b: must not be negative")
        if self.min_len < 0:
            raise NmtError(f"min_len: {self.min_len}; must not be negative")
        if self.no_repeat_ngram_size < 0:
            raise NmtError(
                f"no_repeat_ngram_size: {self.no_repeat_ngram_size}; use 0 (off) or more"
            )
        if self.sampling_topk < 0:
            raise NmtError(f"sampling_topk: {self.sampling_topk}; use 0 (off) or more")
        if not 0.0 < self.sampling_topp <= 1.0:
            raise NmtError(f"sampling_topp: {self.sampling_topp}; use a value in (0, 1]")
        if not self.temperature > 0:
            raise NmtError(f"temperature: {self.temperature}; must be positive")
        if (self.sampling_topk or self.sampling_topp < 1.0) and not self.sampling:
            raise NmtError("sampling_topk / sampling_topp: set sampling=true to sample")


@dataclass
class GenerateConfig(SearchConfig):
    """nmt-generate: translate text (a file or stdin) or a data dir split."""

    # The key is not `model`: that name is the config group of model presets in configs/.
    checkpoint: Any = None  # checkpoint file, or a list [a.pt,b.pt] to ensemble (required)
    input: str = "-"  # text file to translate, "-" for stdin, or a data dir (with split=)
    split: Optional[str] = None  # with a data dir as input: the binarized split ("test")
    ref: Optional[str] = None  # reference file for raw text input: print BLEU at the end
    output: str = "-"  # where translations go; "-" = stdout
    format: str = "plain"  # plain: one translation per line; fairseq: S-/T-/H-/D-/P- lines
    print_alignment: bool = False  # fairseq format: A- lines (hard alignment from attention)
    alignment_layer: int = -1  # decoder layer whose attention gives alignments; -1 = last
    prefix: Optional[str] = None  # target text every translation must start with
    max_tokens: int = 0  # source tokens per batch (padding included); 0 = no limit
    max_sentences: int = 64  # sentences per batch
    buffer_size: int = 10000  # lines read ahead and sorted by length (file or piped input)
    interactive: Optional[bool] = None  # translate each line as soon as read; null = for stdin
    overlong: str = "truncate"  # source longer than the model accepts: truncate (warn) or error
    device: str = "auto"  # cpu, cuda, cuda:1, or auto (cuda when available)
    dtype: str = "fp32"  # fp32, bf16 or fp16 (autocast; fp16 needs cuda)
    threads: int = 0  # CPU threads for torch; 0 = torch's default
    progress: bool = True  # tqdm bar on stderr for file input
    debug: bool = False  # tracebacks instead of one-line errors

    def validate(self) -> None:
        super().validate()
        if self.format not in FORMATS:
            raise NmtError(f"format: {self.format!r}; choose from {', '.join(FORMATS)}")
        if self.dtype not in DTYPES:
            raise NmtError(f"dtype: {self.dtype!r}; choose from {', '.join(DTYPES)}")
        if self.overlong not in OVERLONG:
            raise NmtError(f"overlong: {self.overlong!r}; choose from {', '.join(OVERLONG)}")
        if self.max_tokens < 0 or self.max_sentences < 1:
            raise NmtError("max_tokens must be >= 0 and max_sentences >= 1")
        if self.buffer_size < 1:
            raise NmtError(f"buffer_size: {self.buffer_size}; must be at least 1")
        if self.threads < 0:
            raise NmtError(f"threads: {self.threads}; use 0 (default) or more")
        if self.print_alignment and self.format != "fairseq":
            raise NmtError("print_alignment: A- lines need format=fairseq")
        if self.split is not None and self.ref is not None:
            raise NmtError("ref: a data dir split has its own references; drop ref=")
