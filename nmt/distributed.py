"""torchrun's environment, process-group setup and the few collectives training needs.

Single process is the default: without torchrun's RANK/WORLD_SIZE variables every helper
here is a no-op on one rank. Under torchrun, the process group uses NCCL on CUDA and gloo
on CPU, with a timeout, so that a rank whose peer died fails with a clear NmtError instead
of waiting forever.

Decisions all ranks must take together at every update (skip an update that ran out of
memory on some rank, stop on a signal or at max_time) are agreed on host numbers through
`all_reduce_host`: over a gloo group of its own when the main group is NCCL, so that the
agreement never makes the host wait for the GPU (an NCCL collective on a flag, read back
with .tolist(), drains the GPU's queue of work at every update). Being a host collective it
also notices a peer that died as soon as the next update starts.
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


# The gloo group of all ranks for host-side agreement (all_reduce_host) when the default
# group is NCCL; None when the default group is gloo itself, or none exists.
_host_group: Any = None

# NCCL's watchdog aborts a process whose collective outlasts the group's timeout (SIGABRT
# and torch's own log). The host group times out first, so that a rank waiting for a hung
# peer at its host agreement reports nmt's one-line error instead; the watchdog remains
# the backstop for a rank stuck inside a CUDA operation.
NCCL_TIMEOUT_MARGIN_S = 60.0


# Whether this process has started joining a process group (see joined_a_job).
_joined_a_job = False


def joined_a_job() -> bool:
    """Whether this process is a rank of a torch.distributed job (torchrun's WORLD_SIZE
    above 1) that took part, or tried to, in its process group: then the backend's C++
    threads may outlive the job, and the CLI leaves without the interpreter's teardown
    when its command ends (nmt.cli._exit). A process that only simulated a job (a test calling
    init_process_group with torch's calls replaced) is not one."""
    return _joined_a_job and os.environ.get("WORLD_SIZE", "1").strip() not in ("", "1")


def init_process_group(env: DistEnv, device: torch.device, timeout_s: float) -> None:
    """NCCL on CUDA, gloo on CPU; MASTER_ADDR/MASTER_PORT come from torchrun. On CUDA a
    second, gloo group carries the host-side agreements (see all_reduce_host), with the
    timeout `timeout_s`; NCCL's is NCCL_TIMEOUT_MARGIN_S longer."""
    global _host_group, _joined_a_job
    if not env.is_distributed or dist.is_initialized():
        return
    for key in ("MASTER_ADDR", "MASTER_PORT"):
        if key not in os.environ:
            raise NmtError(f"environment {key}: not set; start distributed runs with torchrun")
    _joined_a_job = True  # a failed start may leave the backend's threads behind too
    backend = "nccl" if device.type == "cuda" else "gloo"
    kwargs: dict[str, Any] = {}
    group_timeout = timeout_s
    if device.type == "cuda":
        kwargs["device_id"] = device  # binds NCCL to this rank's GPU up front
        group_timeout += NCCL_TIMEOUT_MARGIN_S
    try:
        dist.init_process_group(
            backend,
            rank=env.rank,
            world_size=env.world_size,
            timeout=timedelta(seconds=group_timeout),
            **kwargs,
        )
        if backend == "nccl":
            _host_group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
    except Exception as exc:
        raise peer_error(exc, env, "while starting the process group") from exc


def destroy_process_group(wait_for_peers: bool = True) -> None:
    """Leave the job (every group); with `wait_for_peers`, only once every rank got here.

    A rank that tears its connections down while a peer is still inside a collective with
    it makes that peer fail. After a failure (`wait_for_peers=False`) nobody is waited for,
    and NCCL is aborted rather than destroyed: destroying flushes its queued collectives
    first, and one that waits for a dead peer never finishes, so the process would hang
    there (before its one-line error is printed) until NCCL's watchdog kills it.
    """
    global _host_group
    if not dist.is_initialized():
        return
    abort = getattr(dist.distributed_c10d, "_abort_process_group", None)  # torch >= 2.5
    try:
        if wait_for_peers and dist.get_world_size() > 1:
            dist.barrier(group=_host_group)
    except Exception:  # nobody left to wait for: the work is done, leave all the same
        pass
    finally:
        _host_group = None
        if not wait_for_peers and abort is not None and dist.get_backend() == "nccl":
            try:
                abort()  # every group, the gloo host group too, without waiting for any
            except Exception:  # the run failed already: its error is the one to report
                pass
        else:
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


def all_reduce_host(values: list[int], op: str = "sum") -> list[int]:
    """Sum ("sum") or maximum ("max") of a few host integers over ranks (the values
    themselves on one process). Host-side only: never waits for a GPU."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return list(values)
    t = torch.tensor(values, dtype=torch.int64)  # CPU: gloo
    reduce_op = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op]
    dist.all_reduce(t, op=reduce_op, group=_host_group)
    return t.tolist()


def all_gather_objects(obj: Any) -> list[Any]:
    """[obj of rank 0, obj of rank 1, ...] (a one-element list on one process); pickled
    and exchanged on the host (the gloo group), never through a GPU."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj, group=_host_group)
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
