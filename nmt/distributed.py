"""torchrun's environment, process-group setup and the few collectives training needs.

Single process is the default: without torchrun's RANK/WORLD_SIZE variables every helper
here is a no-op on one rank. Under torchrun, the process group uses NCCL on CUDA and gloo
on CPU, with a timeout, so that a rank whose peer died fails with a clear NmtError instead
of waiting forever.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from nmt.errors import NmtError


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits in the job."""

    rank: int = 0  # global rank
    world_size: int = 1  # number of processes
    local_rank: int = 0  # rank on this node (picks the CUDA device)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1


def env_from_environ(environ: Mapping[str, str] | None = None) -> DistEnv:
    """Read torchrun's RANK, WORLD_SIZE and LOCAL_RANK (all absent = one process)."""
    environ = os.environ if environ is None else environ

    def number(key: str) -> int | None:
        raw = environ.get(key)
        try:
            return None if raw is None else int(raw)
        except ValueError:
            raise NmtError(f"environment {key}={raw}: not an integer (set by torchrun)") from None

    rank, world, local = number("RANK"), number("WORLD_SIZE"), number("LOCAL_RANK")
    rank = 0 if rank is None else rank
    world = 1 if world is None else world
    local = rank if local is None else local
    if world < 1 or not 0 <= rank < world:
        raise NmtError(f"environment RANK={rank} WORLD_SIZE={world}: need 0 <= RANK < WORLD_SIZE")
    return DistEnv(rank=rank, world_size=world, local_rank=local)


def init_process_group(env: DistEnv, device: torch.device, timeout_s: float) -> None:
    """NCCL on CUDA, gloo on CPU; MASTER_ADDR/MASTER_PORT come from torchrun."""
    if not env.is_distributed or dist.is_initialized():
        return
    for key in ("MASTER_ADDR", "MASTER_PORT"):
        if key not in os.environ:
            raise NmtError(f"environment {key}: not set; start distributed runs with torchrun")
    backend = "nccl" if device.type == "cuda" else "gloo"
    kwargs: dict[str, Any] = {}
    if device.type == "cuda":
        kwargs["device_id"] = device  # binds NCCL to this rank's GPU up front
    try:
        dist.init_process_group(
            backend,
            rank=env.rank,
            world_size=env.world_size,
            timeout=timedelta(seconds=timeout_s),
            **kwargs,
        )
    except Exception as exc:
        raise peer_error(exc, env, "while starting the process group") from exc


def destroy_process_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def peer_error(exc: BaseException, env: DistEnv, where: str) -> NmtError:
    """The one-line error a rank reports when a collective fails or times out."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    first = re.sub(r"^\[[^\]]*\]\s*", "", first)[:160]  # drop gloo's "[.../pair.cc:537]" prefix
    return NmtError(
        f"rank {env.rank}/{env.world_size}: lost contact with the other ranks {where} "
        f"({first}); another rank probably died or hung: see its log. Resume by "
        "running the same command again"
    )


def is_collective_failure(exc: BaseException) -> bool:
    """Errors a collective raises when a peer is gone or too slow."""
    if isinstance(exc, getattr(dist, "DistError", ())):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(
        s in text
        for s in (
            "gloo",
            "nccl",
            "connection closed",
            "connection reset",
            "timed out",
            "timeout",
            "broken pipe",
        )
    )


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """In place sum over ranks (identity on one process)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_reduce_max(t: torch.Tensor) -> torch.Tensor:
    """In place max over ranks; used to agree on stopping (a signal seen by any rank)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t


def all_gather_objects(obj: Any) -> list[Any]:
    """[obj of rank 0, obj of rank 1, ...] (a one-element list on one process)."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def check_shared(path: Path, env: DistEnv) -> None:
    """Every rank must see `path` the same way (there or not): a rank that does not see the
    checkpoint the others resume from would start afresh (save_dir not on shared storage)."""
    seen = all_gather_objects(path.exists())
    if len(set(seen)) > 1:
        ranks = [r for r, there in enumerate(seen) if there]
        missing = [r for r, there in enumerate(seen) if not there]
        raise NmtError(
            f"{path}: ranks {ranks} see it, ranks {missing} do not (rank {env.rank} of "
            f"{env.world_size}); put save_dir on storage every machine shares, at the same "
            'path (docs/training.md, "Several machines")'
        )


def barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
