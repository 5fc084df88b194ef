"""A batch that runs out of memory is skipped and counted, as in fairseq; repeated OOMs stop.

A real CUDA OOM needs a GPU, so the model's forward raises torch.OutOfMemoryError (what
torch.cuda raises) on chosen calls; the trainer's recovery is the same code on any device.
"""

from __future__ import annotations

import json
import sys
import weakref

import pytest
import torch
from helpers import NO_DROPOUT, tiny_config

from nmt.errors import NmtError
from nmt.training import build_training, run
from nmt.training import step as step_module
from nmt.training.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")


def _trainer_running_out_of_memory(
    demo_data_dir, tmp_path, oom_calls: set[int], **overrides
) -> Trainer:
    """A Trainer whose model's forward raises OutOfMemoryError on the calls numbered in
    `oom_calls` (1-based), after the backward of earlier micro-batches has left gradients."""
    trainer = build_training(tiny_config(demo_data_dir, tmp_path / "run", **overrides))
    real_forward = trainer.model.forward
    calls = {"n": 0}

    def forward(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] in oom_calls:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real_forward(*args, **kwargs)

    trainer.model.forward = forward
    return trainer


def _events(run_dir, kind):
    lines = (run_dir / "train.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["type"] == kind]


def test_an_out_of_memory_batch_is_skipped_and_counted(demo_data_dir, tmp_path):
    # update_freq=2: the OOM hits the second micro-batch, after the first one's backward
    trainer = _trainer_running_out_of_memory(
        demo_data_dir, tmp_path, oom_calls={4}, max_update=3, update_freq=2
    )
    result = run(trainer)
    assert result.num_updates == 3 and trainer.oom_skips == 1
    assert (
        trainer.progress.position == 8
    )  # 4 updates' worth of batches consumed: one update dropped
    ooms = _events(tmp_path / "run", "oom")
    assert [(e["update"], e["skipped_total"]) for e in ooms] == [(2, 1)]
    assert _events(tmp_path / "run", "stop")[0]["oom_skipped"] == 1
    assert all(torch.isfinite(v).all() for v in trainer.model.state_dict().values())


def test_the_skipped_update_leaves_no_partial_gradient(demo_data_dir, tmp_path):
    """An OOM in the second micro-batch (after the first one's backward) must drop the first
    one's gradient too: the run then equals one whose OOM hit before any backward."""
    params = {}
    for name, oom_call in (("after_backward", 2), ("before_backward", 1)):
        trainer = _trainer_running_out_of_memory(
            demo_data_dir,
            tmp_path / name,
            oom_calls={oom_call},
            max_update=2,
            update_freq=2,
            model=NO_DROPOUT,
        )
        run(trainer)
        assert trainer.progress.num_updates == 2 and trainer.oom_skips == 1
        params[name] = trainer.model.state_dict()
    for key, value in params["after_backward"].items():
        assert torch.equal(value, params["before_backward"][key]), key


def test_repeated_out_of_memory_stops_with_a_clear_error(demo_data_dir, tmp_path):
    trainer = _trainer_running_out_of_memory(
        demo_data_dir, tmp_path, oom_calls={2, 3, 4}, max_update=5, max_oom_skips=2
    )
    with pytest.raises(NmtError, match=r"out of memory in 3 updates in a row.*lower max_tokens"):
        run(trainer)
    assert trainer.oom_skips == 3


def _trainer_failing_with(demo_data_dir, tmp_path, error: BaseException, call: int, **overrides):
    """A Trainer whose model's forward raises `error` on forward call number `call`."""
    trainer = build_training(tiny_config(demo_data_dir, tmp_path / "run", **overrides))
    real_forward = trainer.model.forward
    calls = {"n": 0}

    def forward(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == call:
            raise error
        return real_forward(*args, **kwargs)

    trainer.model.forward = forward
    return trainer


def test_a_cuda_librarys_allocation_failure_is_an_out_of_memory_batch(demo_data_dir, tmp_path):
    """cuBLAS reports a failed allocation as a RuntimeError, not torch.OutOfMemoryError."""
    error = RuntimeError(
        "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"
    )
    trainer = _trainer_failing_with(demo_data_dir, tmp_path, error, call=2, max_update=3)
    result = run(trainer)
    assert result.num_updates == 3 and trainer.oom_skips == 1
    assert [e["update"] for e in _events(tmp_path / "run", "oom")] == [2]


def test_other_runtime_errors_are_not_taken_for_out_of_memory(demo_data_dir, tmp_path):
    error = RuntimeError("CUDA error: an illegal memory access was encountered")
    trainer = _trainer_failing_with(demo_data_dir, tmp_path, error, call=2, max_update=3)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        run(trainer)
    assert trainer.oom_skips == 0


def test_the_failed_batchs_tensors_are_freed_before_the_cache_is_emptied(
    demo_data_dir, tmp_path, monkeypatch
):
    """empty_cache can only return memory no tensor holds: called inside the except block,
    the traceback's frames still hold the failed batch's activations."""
    trainer = build_training(tiny_config(demo_data_dir, tmp_path / "run", max_update=2))
    real_forward = trainer.model.forward
    activations: list[weakref.ref] = []

    def forward(*args, **kwargs):
        out = real_forward(*args, **kwargs)  # the activations of a real forward
        if not activations:
            activations.append(weakref.ref(out))
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return out

    trainer.model.forward = forward
    seen = []

    def free_cached_memory(device):
        seen.append((activations[0]() is None, sys.exc_info()[0]))

    monkeypatch.setattr(step_module, "free_cached_memory", free_cached_memory)
    run(trainer)
    assert trainer.oom_skips == 1 and seen == [(True, None)]


class _OutOfMemoryInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")


@pytest.mark.parametrize("where", ["loss", "backward"])
def test_out_of_memory_in_the_loss_or_the_backward_pass_is_skipped(
    demo_data_dir, tmp_path, monkeypatch, where
):
    trainer = build_training(
        tiny_config(demo_data_dir, tmp_path / "run", max_update=3, update_freq=2)
    )
    real_loss = step_module.output_layer_loss
    calls = {"n": 0}

    def loss(*args, **kwargs):
        calls["n"] += 1
        out = real_loss(*args, **kwargs)
        if calls["n"] == 3:  # update 2, its first batch
            if where == "loss":
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 3.00 GiB")
            out.loss = _OutOfMemoryInBackward.apply(out.loss)
        return out

    monkeypatch.setattr(step_module, "output_layer_loss", loss)
    result = run(trainer)
    assert result.num_updates == 3 and trainer.oom_skips == 1
    assert [e["update"] for e in _events(tmp_path / "run", "oom")] == [2]
    assert all(torch.isfinite(v).all() for v in trainer.model.state_dict().values())
