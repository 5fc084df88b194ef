"""Where and how tensors are computed: device, precision and autocast, threads, TF32, seeds.

Training and generation both go through here, so `device=` and `precision=` mean the same
in every command:
    device     auto (the GPU of this rank when CUDA is there, else cpu) | cpu | cuda | cuda:N
    precision  fp32 | bf16 (autocast, CPU or CUDA) | fp16 (autocast, CUDA only); translation
               on CUDA casts the weights instead (Runtime.inference_weights_dtype)
               | auto (bf16 where the device computes it natively, else fp32; see
               native_bf16)
               | int8 (inference only, CPU only: int8 weights and torch's int8 kernels
               (fbgemm's; oneDNN's for the output layer on CPUs with VNNI) in the
               linear layers, nmt.model.quantize; fp32 elsewhere)
Under torchrun each rank takes the GPU of its LOCAL_RANK: `device=cuda` and `device=auto`
mean cuda:LOCAL_RANK, and a fixed `cuda:N` other than that is refused (ranks would share a
GPU). A launcher that shows each process only its own GPU (CUDA_VISIBLE_DEVICES per rank,
as SLURM's --gpus-per-task does) leaves one visible device: every rank then uses cuda:0,
and `device=cuda:0` says the same.
"""

from __future__ import annotations

import contextlib
import functools
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch

from nmt.errors import NmtError

PRECISIONS = ("fp32", "bf16", "fp16", "auto")  # training and inference
INFERENCE_PRECISIONS = (*PRECISIONS, "int8")
# The CPU features with bf16 dot-product instructions (torch.cpu's private probes). Without
# them oneDNN converts bf16 to fp32 and back around every product: on an AVX2-only AMD
# EPYC, bf16 training ran at 57 target tok/s against fp32's 1,600-2,100 (docs/results.md).
CPU_BF16_PROBES = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
INT8_ENGINES = ("x86", "fbgemm")  # torch's quantized engines with fbgemm's int8 GEMM


def resolve_device(
    name: str, *, local_rank: int = 0, distributed: bool = False, key: str = "device"
) -> torch.device:
    """The torch device that `device=name` means for this process.

    `key` is the config key named in errors. With `distributed` (under torchrun), the GPU
    is chosen by `local_rank`.
    """
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", _rank_gpu(local_rank, distributed, key, name))
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise NmtError(f"{key}={name}: not a device; use auto, cpu, cuda or cuda:N") from None
    if device.type not in ("cpu", "cuda"):
        raise NmtError(f"{key}={name}: nmt runs on cpu or cuda; use one of them (or auto)")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise NmtError(f"{key}={name}: no CUDA device is available; use {key}=cpu")
        if distributed:
            # the rank's own GPU: LOCAL_RANK's, or cuda:0 when the launcher shows each rank
            # one GPU (SLURM --gpus-per-task=1); any other index would share a GPU
            own = _rank_gpu(local_rank, distributed, key, name)
            if device.index is not None and device.index != own:
                raise NmtError(
                    f"{key}={name}: under torchrun each rank uses the GPU of its "
                    f"LOCAL_RANK (cuda:{own} here); use {key}=cuda, and "
                    "CUDA_VISIBLE_DEVICES to choose the GPUs"
                )
            device = torch.device("cuda", own)
        elif device.index is None:
            device = torch.device("cuda", _rank_gpu(local_rank, distributed, key, name))
        if device.index >= torch.cuda.device_count():
            raise NmtError(
                f"{key}={name}: only {torch.cuda.device_count()} CUDA devices are "
                f"visible; use cuda:0..cuda:{torch.cuda.device_count() - 1}"
            )
    return device


def _rank_gpu(local_rank: int, distributed: bool, key: str, name: str) -> int:
    """The GPU index of this process: LOCAL_RANK's under torchrun (0 alone), or 0 when
    each rank sees one GPU only."""
    count = torch.cuda.device_count()
    if local_rank < count:
        return local_rank
    if distributed and count == 1:  # the launcher gave this rank its own GPU
        return 0
    raise NmtError(
        f"{key}={name}: LOCAL_RANK is {local_rank} but only {count} CUDA devices are "
        "visible; start at most one rank per GPU (torchrun --nproc_per_node), or show "
        "each rank its own GPU with CUDA_VISIBLE_DEVICES"
    )


def check_precision(
    precision: str, device: torch.device, key: str = "precision", *, inference: bool = False
) -> None:
    """NmtError unless `precision` is known and runs on `device` (for training, or with
    `inference` for translation, which also has int8)."""
    if precision == "int8" and not inference:
        raise NmtError(
            f"{key}=int8: for translation only (nmt-generate, nmt-serve, Translator); train "
            f"with {key}=fp32 or bf16, then translate with {key}=int8"
        )
    allowed = INFERENCE_PRECISIONS if inference else PRECISIONS
    if precision not in allowed:
        raise NmtError(f"{key}={precision}: unknown; use one of {', '.join(allowed)}")
    if precision == "fp16" and device.type != "cuda":
        raise NmtError(f"{key}=fp16: needs a CUDA device; use {key}=bf16 or fp32 on the CPU")
    if precision == "int8":
        if device.type != "cpu":
            raise NmtError(
                f"{key}=int8: runs on the CPU only (torch's int8 kernels are CPU kernels); "
                f"use device=cpu, or {key}=bf16 or fp16 on {device}"
            )
        if int8_engine() is None:
            raise NmtError(
                f"{key}=int8: this build of torch has no fbgemm int8 kernels (x86-64 builds "
                f"have them); use {key}=fp32 or bf16"
            )


def native_bf16(device: torch.device) -> bool:
    """Whether `device` computes bf16 products in hardware: a CUDA GPU of compute
    capability 8.0 or newer, or an x86 CPU with AVX512_BF16 or AMX. Elsewhere (AVX2-only
    x86, ARM here) it is reported as not native: bf16 would be emulated, slower than fp32."""
    if device.type == "cuda":
        try:
            return torch.cuda.is_bf16_supported(including_emulation=False)
        except TypeError:  # torch < 2.3 has no including_emulation; it reported hardware
            return torch.cuda.is_bf16_supported()
    return any(getattr(torch.cpu, probe, lambda: False)() for probe in CPU_BF16_PROBES)


def resolve_precision(
    precision: str, device: torch.device, key: str = "precision", *, inference: bool = False
) -> tuple[str, str]:
    """(the precision `precision` means on `device`, a note for the log or "").

    auto is bf16 where the device computes it natively and fp32 elsewhere; an explicit
    bf16 on a device that would emulate it runs, with a note that fp32 is faster there.
    """
    check_precision(precision, device, key, inference=inference)
    where = "this GPU" if device.type == "cuda" else "this CPU"
    if precision == "auto":
        if native_bf16(device):
            return "bf16", f"{key}=auto: bf16 ({where} computes bf16 natively)"
        return "fp32", f"{key}=auto: fp32 ({where} has no native bf16, which would be slower)"
    if precision == "bf16" and not native_bf16(device):
        hardware = "compute capability 8.0" if device.type == "cuda" else "AVX512_BF16 or AMX"
        return "bf16", (
            f"{key}=bf16: {where} has no native bf16 ({hardware}), so bf16 is emulated "
            f"and runs slower than fp32 here; {key}=fp32 or auto is faster"
        )
    return precision, ""


def int8_engine() -> str | None:
    """The quantized engine int8 inference runs on in this build of torch, or None."""
    supported = torch.backends.quantized.supported_engines
    return next((e for e in INT8_ENGINES if e in supported), None)


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """The autocast context of `precision` on `device` (a no-op for fp32)."""
    dtype = AUTOCAST_DTYPES.get(precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


F = TypeVar("F", bound=Callable[..., Any])


def _autocast_enabled() -> bool:
    """Whether an autocast context is on for the CPU or CUDA."""
    try:
        return any(torch.is_autocast_enabled(d) for d in ("cpu", "cuda"))
    except TypeError:  # torch < 2.4 takes no device type
        return torch.is_autocast_enabled() or torch.is_autocast_cpu_enabled()


def inference_mode(fn: F) -> F:
    """Run `fn` without autograd: torch.inference_mode, or torch.no_grad under autocast.

    Inference mode turns off autocast's cache of fp32 weights cast to bf16/fp16, so every
    matrix product would cast its weight again at every decoding step (bf16 greedy search
    ran 1.2x faster with the cache on an Intel Xeon with AMX, docs/results.md); under
    no_grad each weight is cast once per autocast block, into the same values."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with torch.no_grad() if _autocast_enabled() else torch.inference_mode():
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def set_threads(threads: int) -> None:
    """torch's intra-op CPU threads; 0 leaves torch's default."""
    if threads > 0:
        torch.set_num_threads(threads)


def enable_tf32(device: torch.device) -> None:
    """fp32 matmuls and convolutions on TF32 tensor cores (CUDA only), as fairseq does:
    ~8x the fp32 rate on Ampere and newer, with 10-bit mantissas inside the products."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def disable_cudnn_attention(device: torch.device) -> None:
    """Keep SDPA off cuDNN's attention kernels (CUDA only).

    On an H100 torch picks cuDNN's fused attention for masked bf16/fp16 batches, and cuDNN
    builds an execution plan on the host for every new shape. Token batching and beam
    search make new shapes all the time (every batch, every decoding step's batch size),
    so the GPU waited on the host: bf16 trained at 0.08x fp32 and translated at 0.18x
    (docs/journal/2026-11-26-gpu-h100.md). Flash and memory-efficient attention have no per-shape
    plan and take the same inputs."""
    if device.type == "cuda" and hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
        torch.backends.cuda.enable_cudnn_sdp(False)


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and torch's (CPU and every CUDA device's) generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


@dataclass(frozen=True)
class Runtime:
    """A resolved device and precision, with the autocast context they imply."""

    device: torch.device
    precision: str = "fp32"  # resolved: never auto
    note: str = ""  # what resolving the precision has to say (resolve_precision), or ""

    def autocast(self) -> contextlib.AbstractContextManager:
        return autocast(self.device, self.precision)

    @property
    def amp_dtype(self) -> torch.dtype | None:
        """The autocast dtype, or None for fp32."""
        return AUTOCAST_DTYPES.get(self.precision)

    @property
    def inference_weights_dtype(self) -> torch.dtype | None:
        """The dtype translation casts the weights to once (bf16/fp16 on CUDA), or None:
        fp32 weights, under autocast where the precision has one.

        On a GPU a decoding step of a small model is a few dozen tiny kernels, bound by
        their launches, and autocast over fp32 weights adds a cast around every layer norm,
        softmax and matmul input at every step. With the weights cast once, bf16 and fp16
        beam search ran 1.0-1.5x as fast as under autocast on an H200, BLEU within 0.1
        (docs/journal/2026-11-26-gpu-h100.md); fairseq-generate --fp16 and CTranslate2 do the same.
        On the CPU autocast stays: casting the weights there was within noise."""
        if self.device.type != "cuda":
            return None
        return self.amp_dtype


def setup(
    device: str = "auto",
    precision: str = "fp32",
    *,
    threads: int = 0,
    local_rank: int = 0,
    distributed: bool = False,
    tf32: bool = True,
    device_key: str = "device",
    inference: bool = False,
) -> Runtime:
    """Resolve and check device and precision, then set threads, TF32 and the attention
    kernels (disable_cudnn_attention) for the process.

    `device_key` names the device option in errors; `inference` admits int8.
    """
    resolved = resolve_device(
        device, local_rank=local_rank, distributed=distributed, key=device_key
    )
    concrete, note = resolve_precision(precision, resolved, inference=inference)
    set_threads(threads)
    if tf32:
        enable_tf32(resolved)
    if resolved.type == "cuda":
        torch.cuda.set_device(resolved)
        disable_cudnn_attention(resolved)
    return Runtime(resolved, concrete, note)
