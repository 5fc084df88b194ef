"""Shared by the training tests: a tiny model and a fast TrainConfig on the demo data dir.

The demo data dir's `valid` split (500 pairs) serves as the training split and `test` as
the validation split, so an epoch is 13 small batches (max_tokens=500) and runs in well under a second.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import is_dataclass, replace
from pathlib import Path
from typing import Any, NoReturn

import torch

from nmt.checkpoint import load_checkpoint
from nmt.model.config import ModelConfig
from nmt.training.config import (
    CheckpointConfig,
    LoggingConfig,
    OptimConfig,
    TrainConfig,
    ValidationConfig,
)
from nmt.vocab import EOS, PAD

TINY_MODEL = ModelConfig(
    embed_dim=16,
    ffn_dim=32,
    attention_heads=2,
    encoder_layers=1,
    decoder_layers=1,
    dropout=0.1,
    share_decoder_input_output_embed=True,
)
NO_DROPOUT = replace(TINY_MODEL, dropout=0.0)  # DDP tests: each rank has its own dropout stream


def with_overrides(cfg: Any, **overrides: Any) -> Any:
    """`dataclasses.replace` that reaches into sections: a dict value replaces only the keys
    it names (`validation={"split": "test", "bleu": {"enabled": True}}`)."""
    changes = {}
    for key, value in overrides.items():
        current = getattr(cfg, key)
        if isinstance(value, dict) and is_dataclass(current):
            value = with_overrides(current, **value)
        changes[key] = value
    return replace(cfg, **changes)


def tiny_config(data_dir: Path, save_dir: Path, **overrides: Any) -> TrainConfig:
    """A TrainConfig that trains the tiny model for a few updates, without slow extras;
    `overrides` as in with_overrides."""
    base = TrainConfig(
        data=str(data_dir),
        save_dir=str(save_dir),
        train_split="valid",
        validation=ValidationConfig(split=""),
        model=TINY_MODEL,
        optim=OptimConfig(lr=1e-3, warmup_updates=4, warmup_init_lr=1e-4),
        max_tokens=500,
        device="cpu",
        threads=1,
        max_update=6,
        logging=LoggingConfig(interval=2, progress_bar=False, tensorboard=False),
        checkpoint=CheckpointConfig(keep_last=-1),
    )
    return with_overrides(base, **overrides)


def cached_and_whole_decoding(model, batch: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits [B,5,V] decoded one step at a time on a cache, the same of the whole prefix
    at once) of an eval model on random ids of its vocabulary (40 source, 50 target ids)."""
    src = torch.randint(4, 40, (batch, 6))
    prev = torch.randint(4, 50, (batch, 5))
    with torch.no_grad():
        enc = model.encode(src)
        whole, _ = model.decode(prev, enc)
        cache = model.new_cache()
        steps = [model.decode(prev[:, t : t + 1], enc, cache)[0] for t in range(prev.size(1))]
    return torch.cat(steps, 1), whole


def random_transformer(vocab: int = 40, seed: int = 0):
    """A small Transformer with random weights (seeded), in eval mode, for decoding tests."""
    from nmt.model.transformer import Transformer

    torch.manual_seed(seed)
    cfg = ModelConfig(
        embed_dim=32,
        ffn_dim=64,
        attention_heads=4,
        encoder_layers=2,
        decoder_layers=2,
        dropout=0.0,
        max_source_positions=32,
        max_target_positions=32,
    )
    return Transformer(cfg, src_vocab_size=vocab, tgt_vocab_size=vocab).eval()


def random_sources(lengths: list[int], seed: int = 0, vocab: int = 40) -> list[torch.Tensor]:
    """Source sentences of random word ids (seeded) of `lengths` (EOS included)."""
    g = torch.Generator().manual_seed(seed)
    return [
        torch.cat([torch.randint(4, vocab, (n - 1,), generator=g), torch.tensor([EOS])])
        for n in lengths
    ]


def padded(sources: list[torch.Tensor]) -> torch.Tensor:
    """[B,S] the sentences right-padded with PAD, as a batch."""
    out = torch.full((len(sources), max(len(s) for s in sources)), PAD)
    for i, s in enumerate(sources):
        out[i, : len(s)] = s
    return out


def unigram_tokenizer(lines: list[str], vocab_size: int, what: str = "test text"):
    """A small unigram SentencePiece model of `lines`, seeded, one thread, without byte
    pieces (characters it never saw are <unk>)."""
    from nmt.data.tokenizer import train_tokenizer

    return train_tokenizer(
        lines,
        vocab_size=vocab_size,
        model_type="unigram",
        character_coverage=1.0,
        byte_fallback=False,
        input_sentence_size=0,
        user_defined_symbols=[],
        num_threads=1,
        seed=1,
        what=what,
    )


def words_tokenizer(words: list[str], vocab_size: int, seed: int = 0):
    """A unigram SentencePiece model of 300 random sentences of `words`, without byte
    pieces: characters outside the words are <unk>."""
    import random

    rng = random.Random(seed)
    text = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 6))) for _ in range(300)]
    return unigram_tokenizer(text, vocab_size, "test words")


def small_preprocess_args(corpus: Path, dest: Path, *extra: str) -> list[str]:
    """nmt-preprocess overrides that build `small_corpus` (tests/conftest.py) quickly into
    `dest`: train, valid and test, a 200-piece model without byte pieces, one worker."""
    return [
        f"data.trainpref={corpus / 'train'}",
        f"data.validpref={corpus / 'valid'}",
        f"data.testpref=[{corpus / 'test'}]",
        f"data.dest={dest}",
        "spm.vocab_size=200",
        "spm.byte_fallback=false",
        "spm.num_threads=1",
        "workers=1",
        *extra,
    ]


def run_training(cfg: TrainConfig):
    """nmt.training.train(cfg), leaving torch's global thread count as it found it."""
    from nmt.training import train

    threads = torch.get_num_threads()
    try:
        return train(cfg)
    finally:
        torch.set_num_threads(threads)


def train_as_a_rank(cfg: TrainConfig) -> NoReturn:
    """run_training(cfg) in a test's torchrun worker, which then leaves as nmt-train's ranks
    do (nmt.cli._exit: output flushed, os._exit(0), no interpreter teardown, where gloo's
    C++ threads can abort a rank that finished its work; journal, reliability diary 12b)."""
    from nmt.cli import _exit

    run_training(cfg)
    _exit(0)


def last_params(save_dir: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(Path(save_dir) / "checkpoint_last.pt")["model"]


def assert_bitwise_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"tensors differ: {different[:5]}"


# ------------------------------------------------------------------ DDP jobs of the tests

TESTS = Path(__file__).resolve().parent  # on the workers' PYTHONPATH: `import helpers`


def worker_env(**extra: str) -> dict[str, str]:
    """The environment of a test's torchrun job or hand-started ranks: this one without
    torchrun's rank variables, one OpenMP thread, tests/ importable, and `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(
        OMP_NUM_THREADS="1",
        PYTHONPATH=f"{TESTS}{os.pathsep}{env.get('PYTHONPATH', '')}",
        PYTHONFAULTHANDLER="1",  # a rank that aborts prints every thread's Python stack
        **extra,
    )
    return env


def torchrun_standalone(args: list[str], log_dir: Path, timeout: float) -> str | None:
    """Run `torchrun --standalone --nproc_per_node 2 ARGS` with each rank's stdout and
    stderr in files under `log_dir`; None when every rank succeeded, else what failed:
    torchrun's summary and the end of each rank's stderr (torchrun's own shows no rank's
    output, which a rank that died of a signal leaves only there)."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    argv += ["--nproc_per_node", "2", "--log-dir", str(log_dir), "--redirects", "3", *args]
    proc = subprocess.run(argv, env=worker_env(), capture_output=True, text=True, timeout=timeout)
    if proc.returncode == 0:
        return None
    ranks = [
        f"--- {path.relative_to(log_dir)}:\n{path.read_text(errors='replace')[-3000:]}"
        for path in sorted(log_dir.rglob("stderr.log"))
    ]
    return "\n".join([proc.stderr[-2000:], *ranks])


@contextmanager
def rendezvous_store() -> Iterator[int]:
    """A TCPStore that the test process serves, on a port the kernel picked and that stays
    bound while the job runs; yields its port.

    Ranks started by hand join it as torchrun's workers join their agent's store
    (rank_env). Picking a free port, closing it and passing its number on to rank 0 raced
    with every other process on the machine (other tests' servers and connections), any of
    which could take the port before rank 0 bound it."""
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    try:
        yield store.port
    finally:
        del store


def rank_env(port: int, rank: int, world_size: int = 2, local_rank: int | None = None):
    """worker_env of rank `rank`, joining the rendezvous_store on `port` as a client."""
    return worker_env(
        RANK=str(rank),
        LOCAL_RANK=str(rank if local_rank is None else local_rank),
        WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        TORCHELASTIC_USE_AGENT_STORE="True",  # every rank a client, none binds MASTER_PORT
    )


def outputs_of(procs: list[subprocess.Popen], timeout: float) -> list[tuple[str, str]]:
    """(stdout, stderr) of each process once it has ended, waiting up to `timeout` s for
    each; none is left running, whatever happens. A process still running then fails the
    test with the end of every process's stderr: what each was doing when it hung."""
    try:
        return [p.communicate(timeout=timeout) for p in procs]
    except subprocess.TimeoutExpired as hung:
        for p in procs:
            p.kill()
        tails = []
        for i, p in enumerate(procs):
            try:
                err = p.communicate(timeout=10)[1] or ""
            except (subprocess.TimeoutExpired, ValueError):  # a child holds the pipe
                err = "(its stderr could not be read)"
            tails.append(f"--- process {i} (exit {p.returncode}) stderr:\n{err[-3000:]}")
        raise AssertionError(f"{hung}\n" + "\n".join(tails)) from None
    finally:
        for p in procs:
            p.kill()


def batches_consumed(trainer) -> int:
    """Batches of the seeded epoch lists a run from scratch has consumed: every earlier
    epoch's whole list, and the first `position` of the current one."""
    progress = trainer.progress
    earlier = range(1, progress.epoch)
    return sum(len(trainer.data.epoch_batches(e)) for e in earlier) + progress.position


def assert_fp16_overflows_were_skipped(trainer, stderr: str, init_scale: float) -> None:
    """After `run(trainer)` in fp16 from a loss scale of `init_scale` >= 2**17 (which
    overflows at once: the gold token's logit gradient, ~0.9 x the scale, exceeds fp16's
    largest number, 65504, down to a scale of 2**17): each overflow skipped its update,
    consumed its batches and halved the scale; no NaN/inf reached the weights."""
    skipped = stderr.count("fp16: gradient overflow")
    assert skipped >= math.log2(init_scale) - 16, stderr[-2000:]
    assert trainer.scaler.scale == init_scale / 2**skipped  # no growth within 2000 updates
    attempts = trainer.progress.num_updates + skipped  # updates made and skipped
    assert batches_consumed(trainer) == attempts * trainer.cfg.update_freq
    assert all(torch.isfinite(v).all() for v in trainer.model.state_dict().values())


def wait_until(proc: subprocess.Popen, ready: Callable[[], bool], timeout: float = 60) -> None:
    """Return as soon as `ready()` holds; fail when `proc` ends first or `timeout` seconds
    pass."""
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, f"exited ({proc.returncode}) before it was ready"
        assert time.monotonic() < deadline, f"not ready within {timeout} s"
        time.sleep(0.05)


def kill_9_when(proc: subprocess.Popen, ready: Callable[[], bool], timeout: float = 60) -> None:
    """SIGKILL `proc` (no cleanup of its own runs) as soon as `ready()` holds; fails when
    the process ends first or `timeout` seconds pass."""
    try:
        wait_until(proc, ready, timeout)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
