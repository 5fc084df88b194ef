"""The GPU path, checked on the CPU (issue 20): what can be checked without a GPU is.

- Host-device synchronisations: training updates and decoding steps run on the meta device
  (tests/meta_device.py), where every read of a device value is counted: none per fp32
  update (also under a simulated DDP job, whose agreements are host collectives), one per
  fp16 update (the overflow check), at most one per decoding step.
- A checkpoint loaded for another device type restores the RNGs through CPU tensors; only
  this rank's CUDA generator is saved and restored (CUDA stubbed).
- A save copies device tensors to the host once.
- Attention gets no mask when the host knows a batch has no padding (SDPA may then pick
  its flash kernels), and the model computes the same either way.
The CUDA runs themselves are in tests/gpu/ (`pytest -m gpu`).
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from helpers import NO_DROPOUT, TINY_MODEL, run_training, tiny_config
from meta_device import DeviceReads
from rounding import assert_same_function, float64_twin

from nmt.checkpoint import load_checkpoint
from nmt.distributed import DistEnv
from nmt.generation.config import SearchConfig
from nmt.generation.generator import SequenceGenerator
from nmt.model.kernels import FastKernels
from nmt.model.transformer import Transformer
from nmt.runtime import Runtime
from nmt.training import build_training, run, state
from nmt.training.checkpointing import BestTracker, rng_state, set_rng_state
from nmt.training.meter import TrainMeter
from nmt.training.optim import LRScheduler, build_optimizer, schedule_function
from nmt.training.scaler import LossScaler
from nmt.training.step import train_step
from nmt.training.trainer import Progress, Trainer
from nmt.vocab import EOS, PAD

pytestmark = pytest.mark.usefixtures("one_thread")

META = torch.device("meta")


def _on_meta(trainer: Trainer) -> Trainer:
    """The trainer with its model, optimizer, schedule and meter on the meta device (the
    model built there: moving it would untie its shared embeddings)."""
    meta = trainer.data.meta
    with torch.device(META):
        trainer.model = Transformer(trainer.cfg.model, meta.src_vocab_size, meta.tgt_vocab_size)
    trainer.runtime = Runtime(META, trainer.cfg.precision)
    trainer.optimizer = build_optimizer(trainer.model.parameters(), trainer.cfg.optim)
    trainer.scheduler = LRScheduler(
        trainer.optimizer, schedule_function(trainer.cfg.optim, trainer.cfg.max_update)
    )
    trainer.meter = TrainMeter(META, trainer.cfg.precision)
    return trainer


# ----------------------------------------------------------------------------- training


@pytest.mark.parametrize("update_freq", [1, 2])
def test_an_fp32_update_never_waits_for_the_device(
    demo_data_dir, tmp_path, monkeypatch, update_freq
):
    trainer = _on_meta(
        build_training(
            tiny_config(
                demo_data_dir, tmp_path / "run", update_freq=update_freq, optim={"clip_norm": 0.5}
            )
        )
    )
    batches = trainer.data.epoch_batches(1)
    reads = DeviceReads(monkeypatch)
    for u in range(4):
        train_step(trainer, batches[u * update_freq : (u + 1) * update_freq])
    assert trainer.progress.num_updates == 4
    assert reads.log == []


def test_an_fp16_update_reads_the_device_once(demo_data_dir, tmp_path, monkeypatch):
    """fp16's one read: whether the unscaled gradient norm is finite (skip or step)."""
    trainer = _on_meta(build_training(tiny_config(demo_data_dir, tmp_path / "run", update_freq=2)))
    trainer.scaler = LossScaler(init_scale=128.0)
    batches = trainer.data.epoch_batches(1)
    reads = DeviceReads(monkeypatch, answer=lambda t, method: True)  # finite: step
    for u in range(3):
        train_step(trainer, batches[2 * u : 2 * u + 2])
    assert trainer.progress.num_updates == 3
    assert reads.log == [("__bool__", ())] * 3


def test_a_ddp_job_agrees_on_the_host_without_waiting_for_the_device(
    demo_data_dir, tmp_path, monkeypatch
):
    """Rank 0 of a simulated 2-rank job, through the training loop: the per-update
    agreements (out of memory? stop?) are all-reduces of CPU tensors, and no device value
    is read per update (the log line at the end reads its figures once)."""
    reductions: list[torch.device] = []

    def all_reduce(t, op=None, group=None):
        reductions.append(t.device)

    dist = torch.distributed
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    monkeypatch.setattr(dist, "barrier", lambda group=None: None)
    monkeypatch.setattr(dist, "destroy_process_group", lambda group=None: None)
    reads_per_run, device_reductions = [], []
    for max_update in (3, 6):
        cfg = tiny_config(
            demo_data_dir,
            tmp_path / str(max_update),
            max_update=max_update,
            checkpoint={"no_save": True},
            logging={"interval": 1000},
        )
        trainer = _on_meta(build_training(cfg))
        trainer.env = DistEnv(rank=0, world_size=2, local_rank=0)
        # the meter's reads: no update had a non-finite gradient (-1), zero sums
        reads = DeviceReads(monkeypatch, lambda t, method: -1 if method == "__int__" else None)
        reductions.clear()
        result = run(trainer)
        assert result.num_updates == max_update
        host = [d for d in reductions if d.type == "cpu"]
        assert len(host) == 2 * max_update  # out-of-memory and stop flags, per update
        device_reductions.append(len(reductions) - len(host))
        reads_per_run.append(len(reads.log))
    # the final log line's reduction and reads; none per update
    assert device_reductions[0] == device_reductions[1] == 1
    assert reads_per_run[0] == reads_per_run[1]


# --------------------------------------------------------------------------- generation


def _decode_on_meta(monkeypatch, search: SearchConfig, longest: int, prefix: bool = False):
    """Decode a batch of 3 sentences on the meta device for longest + 1 steps (no
    hypothesis ever finishes); one sentence leaves at step 2. Returns the device reads."""
    step_reads = iter(range(10**6))

    def answer(t: torch.Tensor, method: str):
        if method != "tolist" or t.dim() != 1 or t.numel() != 3:
            return None
        if t.dtype == torch.long and not hasattr(answer, "started"):
            answer.started = True  # the batch's read: longest, shortest limit, shortest source
            return [longest, longest, 5]
        step = next(step_reads)
        return [1 if step == 2 else 0, longest, 0]  # done, shortest limit left, finishing

    src = torch.full((3, 6), 7, dtype=torch.long, device=META)
    prefix_tokens = torch.full((3, 2), 9, dtype=torch.long, device=META) if prefix else None
    model = Transformer(TINY_MODEL, 40, 40).eval()
    generator = SequenceGenerator([model], search)
    model.to(META)
    generator.rng = None  # sampling: meta has no generator; torch's global one will do
    reads = DeviceReads(monkeypatch, answer)
    generator.generate(src, prefix_tokens)
    return reads


@pytest.mark.parametrize(
    "search",
    [
        SearchConfig(beam=4),
        SearchConfig(beam=1),
        SearchConfig(beam=3, no_repeat_ngram_size=2, min_len=2, unkpen=1.0),
        SearchConfig(beam=2, sampling=True, sampling_topk=5),
        SearchConfig(beam=3, use_cache=False),
    ],
    ids=["beam", "greedy", "rules", "sampling", "uncached"],
)
def test_a_decoding_step_reads_the_device_once(monkeypatch, search):
    """Per step one small read (finished hypotheses, sentences done, the shortest limit
    left); a sentence leaving the batch and forced EOS at the length limits read nothing
    more. Counted as the growth of reads from 6 to 12 steps."""
    short = _decode_on_meta(monkeypatch, search, longest=6)
    long = _decode_on_meta(monkeypatch, search, longest=12)
    assert len(long.log) - len(short.log) == 6
    # the batch's read, then the 13 steps' (the rest is collecting the results)
    assert long.log[:14] == [("tolist", (3,))] * 14


def test_forced_prefixes_read_nothing_per_step(monkeypatch):
    search = SearchConfig(beam=2)
    short = _decode_on_meta(monkeypatch, search, longest=6, prefix=True)
    long = _decode_on_meta(monkeypatch, search, longest=12, prefix=True)
    assert len(long.log) - len(short.log) == 6


# ------------------------------------------------------------------------------ RNG states


@pytest.mark.filterwarnings("ignore:for .*copying from a non-meta parameter")
def test_a_checkpoint_restored_for_another_device_restores_the_rngs(demo_data_dir, tmp_path):
    """The state is loaded to the CPU whatever the device (here meta, as CUDA would be):
    generator states are CPU byte tensors, which torch refuses anywhere else."""
    cfg = tiny_config(demo_data_dir, tmp_path / "run", max_update=3)
    run_training(cfg)
    saved = load_checkpoint(tmp_path / "run" / "checkpoint_last.pt")["train_state"]["rng"][0]
    fresh = _on_meta(build_training(tiny_config(demo_data_dir, tmp_path / "fresh")))
    torch.manual_seed(123), np.random.seed(123), random.seed(123)  # something else
    progress = Progress()
    state.restore(
        cfg,
        fresh.data,
        tmp_path / "run" / "checkpoint_last.pt",
        model=fresh.model,
        optimizer=fresh.optimizer,
        scheduler=fresh.scheduler,
        scaler=fresh.scaler,
        best=BestTracker("loss", False),
        progress=progress,
        ema=None,
        rank=0,
        device=META,
    )
    assert progress.num_updates == 3
    assert torch.equal(torch.get_rng_state(), saved["torch"])
    assert np.array_equal(np.random.get_state()[1], saved["numpy"]["keys"].numpy())
    assert random.getstate()[1] == tuple(saved["python"]["state"].tolist())
    assert next(iter(fresh.optimizer.state.values()))["exp_avg"].device == META


@pytest.fixture
def stub_cuda(monkeypatch):
    """Four GPUs' generators, as CPU byte tensors: {index: state}; whole-machine calls
    (get_rng_state_all, set_rng_state_all) fail."""
    generators = {i: torch.full((16,), i, dtype=torch.uint8) for i in range(4)}

    def forbidden(*args, **kwargs):
        raise AssertionError("a rank must touch only its own GPU's generator")

    def get_state(device="cuda"):
        return generators[torch.device(device).index].clone()

    def set_state(new_state, device="cuda"):
        assert new_state.device.type == "cpu" and new_state.dtype == torch.uint8
        generators[torch.device(device).index] = new_state.clone()

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state", get_state)
    monkeypatch.setattr(torch.cuda, "set_rng_state", set_state)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", forbidden)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", forbidden)
    return generators


def test_each_rank_saves_and_restores_only_its_own_gpus_generator(stub_cuda):
    saved = rng_state(torch.device("cuda", 2))
    assert torch.equal(saved["cuda"], stub_cuda[2])
    # a resumed rank on another GPU, even with fewer GPUs visible, gets that stream
    set_rng_state(saved, torch.device("cuda", 0))
    assert torch.equal(stub_cuda[0], stub_cuda[2]) and stub_cuda[1][0] == 1
    # a CPU run neither saves nor restores a CUDA generator
    assert rng_state(torch.device("cpu"))["cuda"] is None
    set_rng_state(rng_state(torch.device("cpu")), torch.device("cpu"))
    assert [int(g[0]) for g in stub_cuda.values()] == [2, 1, 2, 3]


def test_checkpoints_with_every_gpus_generators_restore_this_ranks_own(stub_cuda):
    """Checkpoints written before this fix hold get_rng_state_all()'s list."""
    old = rng_state(torch.device("cpu"))
    old["cuda"] = [torch.full((16,), 10 + i, dtype=torch.uint8) for i in range(2)]
    set_rng_state(old, torch.device("cuda", 1))
    assert int(stub_cuda[1][0]) == 11 and int(stub_cuda[0][0]) == 0
    set_rng_state(old, torch.device("cuda", 3))  # no state saved for GPU 3: left as it is
    assert int(stub_cuda[3][0]) == 3


# ------------------------------------------------------------------------------- saving


def test_a_save_copies_device_tensors_to_the_host_once(demo_data_dir, tmp_path, monkeypatch):
    """Weights and optimizer state on the (meta) device: each tensor is copied to the host
    exactly once per save, and the file holds host tensors."""
    trainer = _on_meta(build_training(tiny_config(demo_data_dir, tmp_path / "run")))
    train_step(trainer, trainer.data.epoch_batches(1)[:1])
    on_device = len(trainer.model.state_dict()) + sum(
        v.device == META for s in trainer.optimizer.state.values() for v in s.values()
    )
    reads = DeviceReads(monkeypatch)
    monkeypatch.setattr(trainer.meter, "check_finite", lambda: None)
    state.save(trainer, numbered=False, best_value=None)
    assert len(reads.log) == on_device and {m for m, _ in reads.log} == {"cpu"}
    ckpt = load_checkpoint(tmp_path / "run" / "checkpoint_last.pt", map_location=None)
    saved = [*ckpt["model"].values()] + [
        v
        for s in ckpt["train_state"]["optimizer"]["state"].values()
        for v in s.values()
        if isinstance(v, torch.Tensor)
    ]
    assert all(v.device.type == "cpu" for v in saved)


# -------------------------------------------------------------------------------- masks


def test_no_mask_when_the_host_knows_there_is_no_padding():
    padding = torch.zeros(2, 5, dtype=torch.bool, device=META)
    kernels = FastKernels()
    assert kernels.attention_mask(padding, padded=False) is None
    assert kernels.attention_mask(padding, padded=True).shape == (2, 1, 1, 5)
    assert kernels.attention_mask(padding).shape == (2, 1, 1, 5)  # a GPU cannot look: mask


@pytest.mark.parametrize("padded", [None, True, False])
def test_the_padding_hint_changes_no_output(padded):
    torch.manual_seed(0)
    model = Transformer(NO_DROPOUT, 40, 40).eval()
    src = torch.randint(4, 40, (3, 6))
    src[:, -1] = EOS
    prev = torch.randint(4, 40, (3, 5))
    with torch.no_grad():
        want = model(src, prev)
        got = model(src, prev, src_padded=padded)
        enc = model.encode(src, padded)
        cached_logits, _ = model.decode(prev[:, :1], enc, model.new_cache())
        exact = float64_twin(model)(src, prev)
    assert torch.equal(got, want)
    assert enc.padded is padded
    assert_same_function(cached_logits[:, 0], want[:, 0], exact[:, 0])  # tests/rounding.py
    assert not src.eq(PAD).any()


def _attention_masks(monkeypatch) -> list:
    """The attn_mask of every SDPA call from now on (None or a tensor), in order."""
    masks: list = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, *args, **kwargs):
        masks.append(attn_mask)
        return sdpa(q, k, v, attn_mask, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    return masks


def test_a_training_batch_without_padding_gives_sdpa_no_mask(demo_data_dir, tmp_path, monkeypatch):
    """On a GPU (meta here) the training step tells the model from the batch's host copy
    whether any source is padded: an unpadded batch's attention calls (encoder, decoder's
    causal self- and cross-attention) get no mask, so SDPA may pick flash attention; a
    padded batch's encoder and cross-attention are masked."""
    trainer = _on_meta(build_training(tiny_config(demo_data_dir, tmp_path / "run")))
    sizes = trainer.data.train.src_sizes
    short, long = int(np.argmin(sizes)), int(np.argmax(sizes))
    masks = _attention_masks(monkeypatch)
    train_step(trainer, [np.array([short, short])])  # one length: no padding
    assert len(masks) == 3 and all(m is None for m in masks)  # 1 encoder + 1 decoder layer
    masks.clear()
    train_step(trainer, [np.array([short, long])])
    assert sum(m is not None for m in masks) == 2  # encoder self- and cross-attention


@pytest.mark.parametrize("shortest, masked", [(6, False), (5, True)])
def test_a_decoding_batch_without_padding_gives_attention_no_mask(monkeypatch, shortest, masked):
    """The generator learns from its one read per batch whether sources are padded, and
    passes it on: the encoder and the cross-attention of an unpadded batch get no mask."""
    hints: list = []
    real = FastKernels.attention_mask

    def spy(self, padding_mask, padded=None):
        hints.append(padded)
        return real(self, padding_mask, padded)

    monkeypatch.setattr(FastKernels, "attention_mask", spy)

    def answer(t: torch.Tensor, method: str):  # [longest, shortest limit, shortest source]
        if method == "tolist" and t.dtype == torch.long and not hints:
            return [4, 4, shortest]
        return None  # steps: nothing done, nothing finishing

    src = torch.full((3, 6), 7, dtype=torch.long, device=META)
    model = Transformer(TINY_MODEL, 40, 40).eval()
    generator = SequenceGenerator([model], SearchConfig(beam=2))
    model.to(META)
    DeviceReads(monkeypatch, answer)
    generator.generate(src)
    assert hints == [masked, masked]  # the encoder's, then the decoder's (cached) cross-attention


# ------------------------------------------------------------------- process groups


def test_under_nccl_the_host_agreements_have_a_gloo_group_that_times_out_first(monkeypatch):
    """The per-update agreements never go through NCCL (no GPU wait), and a hung peer
    is reported by them (one line) before NCCL's watchdog would abort the process."""
    from datetime import timedelta

    from nmt import distributed

    groups = []
    dist = torch.distributed
    monkeypatch.setattr(
        dist, "init_process_group", lambda backend, **kw: groups.append((backend, kw["timeout"]))
    )
    monkeypatch.setattr(
        dist, "new_group", lambda backend, timeout: groups.append((backend, timeout)) or "host"
    )
    monkeypatch.setattr(distributed, "_host_group", None)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    distributed.init_process_group(DistEnv(0, 2, 0), torch.device("cuda", 0), 30.0)
    margin = distributed.NCCL_TIMEOUT_MARGIN_S
    assert groups == [("nccl", timedelta(seconds=30 + margin)), ("gloo", timedelta(seconds=30))]
    assert distributed._host_group == "host"
    groups.clear()
    monkeypatch.setattr(distributed, "_host_group", None)
    distributed.init_process_group(DistEnv(0, 2, 0), torch.device("cpu"), 30.0)
    assert groups == [("gloo", timedelta(seconds=30))]  # gloo is the host group itself
    assert distributed._host_group is None


@pytest.mark.parametrize(
    "backend, finished, want",
    [
        ("nccl", False, ["abort"]),  # a peer may be gone: never flush NCCL's queue
        ("nccl", True, ["barrier", "destroy"]),
        ("gloo", False, ["destroy"]),  # gloo's destroy waits for nothing
        ("gloo", True, ["barrier", "destroy"]),
    ],
)
def test_after_a_failure_nccl_is_aborted_not_flushed(monkeypatch, backend, finished, want):
    """destroy_process_group flushes NCCL's queued collectives; one waiting for a dead peer
    never finishes, and the rank would hang until NCCL's watchdog aborted it, its one-line
    error unprinted. (NCCL needs GPUs: torch's calls are recorded here; tests/gpu/
    test_cuda_ddp.py kills a real NCCL rank.)"""
    from nmt import distributed

    calls: list[str] = []
    dist = torch.distributed
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: backend)
    monkeypatch.setattr(dist, "barrier", lambda group=None: calls.append("barrier"))
    monkeypatch.setattr(dist, "destroy_process_group", lambda group=None: calls.append("destroy"))
    monkeypatch.setattr(
        dist.distributed_c10d, "_abort_process_group", lambda group=None: calls.append("abort")
    )
    monkeypatch.setattr(distributed, "_host_group", "host" if backend == "nccl" else None)
    distributed.destroy_process_group(wait_for_peers=finished)
    assert calls == want and distributed._host_group is None


def test_a_failing_nccl_abort_leaves_the_runs_own_error_to_be_reported(monkeypatch):
    from nmt import distributed

    def abort(group=None):
        raise RuntimeError("NCCL error: remote process exited or there was a network error")

    dist = torch.distributed
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(dist.distributed_c10d, "_abort_process_group", abort)
    distributed.destroy_process_group(wait_for_peers=False)  # raises nothing
