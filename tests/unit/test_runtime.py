"""nmt.runtime: device and precision mean the same in every command.

CUDA is simulated where the choice of device is what is tested (torch.cuda.is_available and
device_count patched): this machine has no GPU, and the logic under test is plain Python.
"""

from __future__ import annotations

import pytest
import torch

from nmt import runtime
from nmt.errors import NmtError


@pytest.fixture
def two_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


def test_auto_is_the_cpu_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert runtime.resolve_device("auto") == torch.device("cpu")
    assert runtime.resolve_device("cpu") == torch.device("cpu")


def test_cuda_without_a_gpu_names_the_key(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(NmtError, match="device=cuda: no CUDA device is available; use device=cpu"):
        runtime.resolve_device("cuda")


@pytest.mark.parametrize("name", ["tpu", "gpu0", "mps"])
def test_other_devices_are_refused(name):
    with pytest.raises(NmtError, match=f"device={name}: "):
        runtime.resolve_device(name)


def test_each_torchrun_rank_takes_the_gpu_of_its_local_rank(two_gpus):
    for local_rank in (0, 1):
        for name in ("auto", "cuda"):
            device = runtime.resolve_device(name, local_rank=local_rank, distributed=True)
            assert device == torch.device("cuda", local_rank)
    assert runtime.resolve_device("cuda:1", local_rank=1, distributed=True) == torch.device(
        "cuda", 1
    )
    with pytest.raises(NmtError, match="under torchrun each rank uses the GPU of its LOCAL_RANK"):
        runtime.resolve_device("cuda:0", local_rank=1, distributed=True)


def test_a_single_process_may_pick_any_visible_gpu(two_gpus):
    assert runtime.resolve_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(NmtError, match="only 2 CUDA devices are visible"):
        runtime.resolve_device("cuda:2")


def test_precision_checks_name_the_key():
    cpu = torch.device("cpu")
    runtime.check_precision("bf16", cpu)
    with pytest.raises(NmtError, match="precision=fp16: needs a CUDA device"):
        runtime.check_precision("fp16", cpu)
    with pytest.raises(NmtError, match="precision=fp8: unknown; use one of fp32, bf16, fp16, auto"):
        runtime.check_precision("fp8", cpu)


def test_autocast_follows_the_precision():
    rt = runtime.Runtime(torch.device("cpu"), "bf16")
    x = torch.randn(4, 4)
    with rt.autocast():
        assert (x @ x).dtype == torch.bfloat16
    with runtime.Runtime(torch.device("cpu"), "fp32").autocast():
        assert (x @ x).dtype == torch.float32
    assert rt.amp_dtype == torch.bfloat16


def test_translation_casts_the_weights_on_cuda_only():
    """On CUDA bf16/fp16 translation casts the weights once (autocast's per-step casts
    cost bf16 beam search up to 1.5x its time on an H200); on the CPU autocast stays."""
    cuda, cpu = torch.device("cuda"), torch.device("cpu")  # no GPU needed to build these
    assert runtime.Runtime(cuda, "bf16").inference_weights_dtype == torch.bfloat16
    assert runtime.Runtime(cuda, "fp16").inference_weights_dtype == torch.float16
    assert runtime.Runtime(cuda, "fp32").inference_weights_dtype is None
    for precision in ("fp32", "bf16", "int8"):
        assert runtime.Runtime(cpu, precision).inference_weights_dtype is None


def test_setup_sets_threads_and_returns_the_runtime():
    before = torch.get_num_threads()
    try:
        rt = runtime.setup("cpu", "fp32", threads=1)
        assert rt == runtime.Runtime(torch.device("cpu"), "fp32") and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_seed_everything_makes_every_generator_repeat():
    import random

    import numpy as np

    runtime.seed_everything(7)
    first = (random.random(), np.random.rand(), torch.rand(1).item())
    runtime.seed_everything(7)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == first


def test_each_rank_sees_its_own_single_gpu_as_cuda_0(monkeypatch):
    """A launcher that sets CUDA_VISIBLE_DEVICES per rank (SLURM --gpus-per-task=1)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    for name in ("auto", "cuda", "cuda:0"):
        assert runtime.resolve_device(name, local_rank=3, distributed=True) == torch.device(
            "cuda", 0
        )
    with pytest.raises(NmtError, match=r"device=cuda:1: .* LOCAL_RANK \(cuda:0 here\)"):
        runtime.resolve_device("cuda:1", local_rank=3, distributed=True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(NmtError, match="LOCAL_RANK is 3 but only 2 CUDA devices are visible"):
        runtime.resolve_device("auto", local_rank=3, distributed=True)


def test_a_torchrun_rank_trains_on_the_gpu_of_its_local_rank(two_gpus, monkeypatch, tmp_path):
    """torchrun's environment, simulated, through nmt.training.build_training: rank 3 of a
    4-rank job on a node with 2 GPUs (LOCAL_RANK 1) takes cuda:1 for its runtime, its
    process group and its current device."""
    from helpers import tiny_config

    from nmt import distributed
    from nmt.training import build_training

    for key, value in dict(RANK="3", WORLD_SIZE="4", LOCAL_RANK="1").items():
        monkeypatch.setenv(key, value)
    chosen = {}
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: chosen.setdefault("current", d))

    class Stop(Exception):
        pass

    def init_process_group(env, device, timeout_s):
        chosen["group"] = device
        raise Stop  # no real job to join: the device is chosen by now

    monkeypatch.setattr(distributed, "init_process_group", init_process_group)
    with pytest.raises(Stop):
        build_training(tiny_config(tmp_path / "data", tmp_path / "run", device="auto"))
    assert chosen == {"current": torch.device("cuda", 1), "group": torch.device("cuda", 1)}


def test_tf32_is_switched_on_for_cuda_only(monkeypatch):
    """fp32 matmuls on TF32 tensor cores on a GPU (as fairseq); nothing changes on a CPU."""
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    before = (matmul.allow_tf32, cudnn.allow_tf32)
    cudnn_attention = torch.backends.cuda.cudnn_sdp_enabled()  # setup("cuda") turns it off
    try:
        matmul.allow_tf32 = cudnn.allow_tf32 = False
        runtime.enable_tf32(torch.device("cpu"))
        assert (matmul.allow_tf32, cudnn.allow_tf32) == (False, False)
        runtime.enable_tf32(torch.device("cuda", 0))
        assert (matmul.allow_tf32, cudnn.allow_tf32) == (True, True)
        matmul.allow_tf32 = False
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
        monkeypatch.setattr(torch.cuda, "set_device", lambda d: None)
        runtime.setup("cuda", "fp32")  # what training calls
        assert matmul.allow_tf32
        matmul.allow_tf32 = False
        runtime.setup("cuda", "fp32", tf32=False)  # what generation calls: exact fp32
        assert not matmul.allow_tf32
    finally:
        matmul.allow_tf32, cudnn.allow_tf32 = before
        torch.backends.cuda.enable_cudnn_sdp(cudnn_attention)


def test_cudnn_attention_is_switched_off_for_cuda_only(monkeypatch):
    """SDPA stays off cuDNN's attention on a GPU: cuDNN plans every new shape on the host,
    and token batching and beam search make new shapes all the time (bf16 on an H100
    trained at 0.08x fp32 and translated at 0.18x with it on, docs/results.md)."""
    cuda = torch.backends.cuda
    before = cuda.cudnn_sdp_enabled()
    try:
        cuda.enable_cudnn_sdp(True)
        runtime.disable_cudnn_attention(torch.device("cpu"))
        assert cuda.cudnn_sdp_enabled()
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
        monkeypatch.setattr(torch.cuda, "set_device", lambda d: None)
        for tf32 in (True, False):  # training's setup and generation's
            cuda.enable_cudnn_sdp(True)
            runtime.setup("cuda", "fp32", tf32=tf32)
            assert not cuda.cudnn_sdp_enabled()
            assert cuda.flash_sdp_enabled() and cuda.mem_efficient_sdp_enabled()
    finally:
        cuda.enable_cudnn_sdp(before)


def _cpu_flags() -> set[str]:
    """The CPU's feature flags as the kernel reports them (x86 /proc/cpuinfo), or empty."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def test_native_bf16_agrees_with_the_kernels_cpu_flags():
    """A real check on this machine: torch's probes against the kernel's own flags."""
    flags = _cpu_flags()
    if not flags:
        pytest.skip("no x86 flags line in /proc/cpuinfo")
    expected = bool(flags & {"avx512_bf16", "amx_tile"})
    assert runtime.native_bf16(torch.device("cpu")) is expected


@pytest.mark.parametrize("native", [True, False])
def test_auto_is_bf16_only_where_the_cpu_computes_it(monkeypatch, native):
    # The CPU's features are simulated (the probes patched): one machine has one CPU.
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: native)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    cpu = torch.device("cpu")
    precision, note = runtime.resolve_precision("auto", cpu)
    assert precision == ("bf16" if native else "fp32")
    assert note.startswith(f"precision=auto: {precision} (this CPU ")
    rt = runtime.setup("cpu", "auto", inference=True)
    assert (rt.precision, rt.note) == (precision, note)
    # an explicit bf16 runs either way; where it is emulated a note says fp32 is faster
    precision, note = runtime.resolve_precision("bf16", cpu, key="dtype")
    assert precision == "bf16"
    if native:
        assert note == ""
    else:
        assert note.startswith("dtype=bf16: this CPU has no native bf16 (AVX512_BF16 or AMX)")
        assert "dtype=fp32 or auto is faster" in note
    assert runtime.resolve_precision("fp32", cpu) == ("fp32", "")


def test_auto_on_a_gpu_follows_its_compute_capability(monkeypatch, two_gpus):
    # CUDA simulated (see the module's docstring); only the choice is under test.
    cuda = torch.device("cuda", 0)
    for native, expected in ((True, "bf16"), (False, "fp32")):
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda native=native, **_: native)
        assert runtime.resolve_precision("auto", cuda)[0] == expected
    assert runtime.resolve_precision("fp16", cuda) == ("fp16", "")


def test_auto_never_means_int8_and_int8_stays_for_translation():
    cpu = torch.device("cpu")
    assert runtime.resolve_precision("auto", cpu, inference=True)[0] in ("bf16", "fp32")
    with pytest.raises(NmtError, match="precision=int8: for translation only"):
        runtime.resolve_precision("int8", cpu)
