"""Training on a CUDA device: precisions, fp16 loss scaling, host syncs, bitwise resume,
out-of-memory recovery, TF32, flash attention (issue 20)."""

from __future__ import annotations

import json
import warnings
from dataclasses import replace

import pytest
import torch
from helpers import (
    NO_DROPOUT,
    assert_bitwise_equal,
    assert_fp16_overflows_were_skipped,
    last_params,
    run_training,
    tiny_config,
)

from nmt.model.transformer import Transformer
from nmt.training import build_training, run
from nmt.training.loss import BLOCK_ELEMENTS, block_elements_for
from nmt.training.step import train_step

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("one_thread")]


def _events(save_dir, kind):
    lines = (save_dir / "train.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["type"] == kind]


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_cuda_training_runs_and_lowers_the_loss(demo_data_dir, tmp_path, precision):
    cfg = tiny_config(
        demo_data_dir,
        tmp_path / precision,
        device="cuda",
        precision=precision,
        max_update=30,
        logging={"interval": 10},
        checkpoint={"no_save": True},
    )
    run_training(
        replace(cfg, optim=replace(cfg.optim, lr=3e-3, warmup_updates=0, scheduler="fixed"))
    )
    losses = [e["loss"] for e in _events(tmp_path / precision, "train")]
    assert losses[-1] < losses[0]


def test_cuda_resume_continues_the_run(demo_data_dir, tmp_path):
    cfg = tiny_config(
        demo_data_dir, tmp_path / "run", device="cuda", precision="fp16", max_update=3
    )
    run_training(cfg)
    result = run_training(replace(cfg, max_update=6))
    assert result.num_updates == 6


def test_fp16_overflow_halves_the_scale_and_skips_the_update(demo_data_dir, tmp_path, capsys):
    """A loss scale of 2**40 overflows fp16 at once: each overflow skips its update and
    halves the scale until the gradients fit; no NaN reaches the weights. (The skipped
    updates' batches run into the second epoch: 13 batches each.)"""
    trainer = build_training(
        tiny_config(
            demo_data_dir,
            tmp_path / "run",
            device="cuda",
            precision="fp16",
            max_update=5,
            fp16={"init_scale": 2.0**40},
            logging={"interval": 1},
        )
    )
    result = run(trainer)
    assert result.num_updates == 5
    assert_fp16_overflows_were_skipped(trainer, capsys.readouterr().err, 2.0**40)
    scales = [e["loss_scale"] for e in _events(tmp_path / "run", "train")]
    assert scales[-1] == trainer.scaler.scale
    ckpt = torch.load(tmp_path / "run" / "checkpoint_last.pt", weights_only=True)
    assert all(torch.isfinite(v).all() for v in ckpt["model"].values())


def _sync_warnings(fn) -> int:
    """How many synchronizing CUDA calls `fn` makes (torch's sync debug mode)."""
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return sum("synchronizing" in str(w.message) for w in caught)


@pytest.mark.parametrize("precision, per_update", [("fp32", 0), ("bf16", 0), ("fp16", 1)])
def test_an_update_synchronizes_at_most_once(demo_data_dir, tmp_path, precision, per_update):
    trainer = build_training(
        tiny_config(
            demo_data_dir, tmp_path / "run", device="cuda", precision=precision, update_freq=2
        )
    )
    batches = trainer.data.epoch_batches(1)
    train_step(trainer, batches[0:2])  # warm-up: cuBLAS handles, allocator pools
    syncs = _sync_warnings(lambda: [train_step(trainer, batches[i : i + 2]) for i in (2, 4, 6)])
    assert syncs == 3 * per_update


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_resume_on_cuda_is_bitwise_exact(demo_data_dir, tmp_path, precision):
    """With deterministic algorithms on, 8 updates equal 4 updates, a restart from
    checkpoint_last.pt (this GPU's RNG, with dropout on) and 4 more."""
    torch.use_deterministic_algorithms(True)
    try:

        def cfg(save_dir, max_update):
            return tiny_config(
                demo_data_dir,
                save_dir,
                device="cuda",
                precision=precision,
                max_update=max_update,
                update_freq=2,
            )

        run_training(cfg(tmp_path / "straight", 8))
        run_training(cfg(tmp_path / "resumed", 4))
        run_training(cfg(tmp_path / "resumed", 8))
    finally:
        torch.use_deterministic_algorithms(False)
    assert_bitwise_equal(last_params(tmp_path / "resumed"), last_params(tmp_path / "straight"))


def test_a_real_out_of_memory_batch_is_skipped_and_its_memory_returned(
    demo_data_dir, tmp_path, monkeypatch
):
    """Update 2's forward holds 1 GiB (as a big batch's activations would), then asks for
    more memory than the GPU has. The update is skipped, and when update 3 starts the 1 GiB
    is free and back with the driver: the cache was emptied after the failed batch's
    frames, which held it, were gone (emptied inside the except block, it stays reserved)."""
    trainer = build_training(
        tiny_config(demo_data_dir, tmp_path / "run", device="cuda", max_update=4)
    )
    real_forward, calls, memory = Transformer.forward, [], {}

    def forward(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:  # update 3's forward
            memory["next"] = (torch.cuda.memory_allocated(), torch.cuda.memory_reserved())
        out = real_forward(self, *args, **kwargs)
        if len(calls) == 2:
            held = torch.ones(2**30, dtype=torch.uint8, device="cuda")  # in this frame only
            memory["failing"] = (torch.cuda.memory_allocated(), torch.cuda.memory_reserved())
            total = torch.cuda.get_device_properties(0).total_memory
            torch.empty(2 * total + held.numel(), dtype=torch.uint8, device="cuda")  # fails
        return out

    monkeypatch.setattr(Transformer, "forward", forward)
    result = run(trainer)
    assert result.num_updates == 4 and trainer.oom_skips == 1
    assert [e["update"] for e in _events(tmp_path / "run", "oom")] == [2]
    allocated, reserved = memory["next"]
    assert allocated < memory["failing"][0] - 2**30 + 2**20  # the 1 GiB is not held
    assert reserved < memory["failing"][1] - 2**30 + 2**20  # nor kept in torch's cache


def test_training_uses_tf32_for_fp32_matmuls(demo_data_dir, tmp_path):
    torch.backends.cuda.matmul.allow_tf32 = False
    build_training(tiny_config(demo_data_dir, tmp_path / "run", device="cuda"))
    assert torch.backends.cuda.matmul.allow_tf32


def test_flash_attention_serves_batches_without_padding():
    """Flash attention takes no mask: with only the flash backend allowed, an unpadded
    batch whose padding the host vouches for runs, a masked one cannot."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    model = Transformer(NO_DROPOUT, 40, 40).cuda()
    src = torch.randint(4, 40, (8, 16), device="cuda")
    prev = torch.randint(4, 40, (8, 12), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16), sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        model(src, prev, src_padded=False).float().sum().backward()
        with pytest.raises(RuntimeError):
            model(src, prev, src_padded=True)


def test_the_fused_loss_takes_large_blocks_on_a_gpu():
    assert block_elements_for(torch.device("cuda", 0)) > BLOCK_ELEMENTS
