"""The checkpoint manager: which files a run writes, which it keeps, and RNG state capture.

Files in the run dir:
    checkpoint_last.pt                 every save; what a re-run resumes from
    checkpoint_best.pt                 the best validation so far (validation.best_metric)
    checkpoint_<epoch>_<update>.pt     at epoch ends and every checkpoint.save_interval_updates;
                                       the newest checkpoint.keep_last are kept
    checkpoint.best_<metric>_<v>.pt    the checkpoint.keep_best best validations
The state is serialised once (atomically, by nmt.checkpoint.save_checkpoint) into
checkpoint_last.pt; the other names of that save are copies of it (nmt.fsutil.atomic_copy:
in the kernel, a reflink where the file system shares extents), put in place by an atomic
rename as well. Every name is a file of its own, never a hard link or a symlink, so that
writing one in place (`cp checkpoint_1_50.pt checkpoint_last.pt`) changes no other, and a
kill at any moment leaves every name holding a complete checkpoint. Temporaries follow
nmt.fsutil's naming (`.<name>.<random>.tmp`); the next run removes what a kill left.
"""

from __future__ import annotations

import math
import random
import re
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from nmt.checkpoint import save_checkpoint, write_failure_hint
from nmt.errors import NmtError
from nmt.fsutil import TMP_SUFFIX, atomic_copy, remove_stale_temps

LAST = "checkpoint_last.pt"
BEST = "checkpoint_best.pt"
CONFIG = "config.yaml"  # the run's resolved config, written at each start
_NUMBERED = re.compile(r"^checkpoint_(\d+)_(\d+)\.pt$")
# train_state key: the names a save copies checkpoint_last.pt to (CheckpointManager.save)
COPIES = "copies"


def saved_update(path: Path) -> int | None:
    """num_updates of a training checkpoint, read without loading its tensors (mmap);
    None when the file is unreadable or holds no train_state."""
    try:
        ckpt = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        return int(ckpt["train_state"]["num_updates"])
    except Exception:  # any damage: the caller leaves such a file alone
        return None


def _cuda_device(device: torch.device | None) -> torch.device | None:
    """The CUDA device whose generator a process saves and restores: `device` when it is
    one; with None, the current CUDA device once CUDA is in use; else None."""
    if device is not None:
        return device if device.type == "cuda" else None
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.device("cuda", torch.cuda.current_device())
    return None


def rng_state(device: torch.device | None = None) -> dict[str, Any]:
    """Every RNG training touches, as CPU tensors and plain values (weights_only-loadable).

    Of the CUDA generators only `device`'s (this rank's GPU) is saved: a run resumed with
    fewer GPUs visible, or with its ranks on other GPUs, restores each rank's own stream.
    """
    legacy_state = cast(tuple[str, np.ndarray, int, int, float], np.random.get_state())
    np_kind, np_keys, np_pos, np_has_gauss, np_gauss = legacy_state
    py_version, py_state, py_gauss = random.getstate()
    cuda = _cuda_device(device)
    return {
        "torch": torch.get_rng_state(),
        "cuda": None if cuda is None else torch.cuda.get_rng_state(cuda),
        "numpy": {
            "kind": np_kind,
            "keys": torch.from_numpy(np_keys.astype(np.int64)),
            "pos": int(np_pos),
            "has_gauss": int(np_has_gauss),
            "gauss": float(np_gauss),
        },
        "python": {
            "version": py_version,
            "state": torch.tensor(py_state, dtype=torch.int64),
            "gauss": py_gauss,
        },
    }


def seed_rank_stream(seed: int, rank: int, update: int = 0) -> None:
    """Seed torch's (CPU and CUDA) and numpy's generators with a stream of `rank`'s own.

    Dropout draws from these, so ranks must not share a stream (their masks would be
    equal). A fresh run seeds (seed, rank); a rank that a resumed run did
    not have before also gets `update`, so that its stream is none drawn from earlier.
    """
    key = [seed, rank] if update == 0 else [seed, rank, update]
    stream = int(np.random.SeedSequence(key).generate_state(1)[0])
    torch.manual_seed(stream)
    np.random.seed(stream)


def set_rng_state(state: dict[str, Any], device: torch.device | None = None) -> None:
    """Restore what rng_state saved; the CUDA generator of `device` (see rng_state).

    Generator states are byte tensors that torch accepts on the CPU only, so they are
    copied there, whatever device the checkpoint was loaded to.
    """
    torch.set_rng_state(_host_bytes(state["torch"]))
    cuda, saved = _cuda_device(device), state.get("cuda")
    if isinstance(saved, (list, tuple)):  # older checkpoints: every visible GPU's, by index
        index = 0 if cuda is None else (cuda.index or 0)
        saved = saved[index] if index < len(saved) else None
    if cuda is not None and saved is not None:
        torch.cuda.set_rng_state(_host_bytes(saved), cuda)
    n = state["numpy"]
    np.random.set_state(
        (n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"])
    )
    p = state["python"]
    random.setstate((p["version"], tuple(int(v) for v in p["state"].tolist()), p["gauss"]))


def _host_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.to("cpu", torch.uint8)


def host_copy(obj: Any) -> Any:
    """`obj` with every tensor on the CPU: a GPU tensor is copied once (then checksummed
    and serialised from that copy), a CPU tensor is itself."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {key: host_copy(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(host_copy(value) for value in obj)
    return obj


class BestTracker:
    """The best validation value so far and the patience counter."""

    def __init__(self, metric: str, maximize: bool) -> None:
        self.metric = metric
        self.maximize = maximize
        self.best: float | None = None
        self.bad_validations = 0  # validations since the last improvement

    def is_better(self, value: float) -> bool:
        if self.best is None:
            return not math.isnan(value)
        return value > self.best if self.maximize else value < self.best

    def update(self, value: float) -> bool:
        """Record a validation; True when it is a new best."""
        if self.is_better(value):
            self.best = value
            self.bad_validations = 0
            return True
        self.bad_validations += 1
        return False

    def state_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "best": self.best, "bad_validations": self.bad_validations}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("metric") == self.metric:  # a changed validation.best_metric starts afresh
            self.best = state["best"]
            self.bad_validations = int(state["bad_validations"])


class CheckpointManager:
    """Writes last/best/numbered checkpoints of a run dir and prunes the old ones."""

    def __init__(
        self, save_dir: str | Path, *, keep_last: int, keep_best: int, metric: str, maximize: bool
    ) -> None:
        self.save_dir = Path(save_dir)
        self.keep_last = keep_last
        self.keep_best = keep_best
        self.metric = metric
        self.maximize = maximize

    @property
    def last_path(self) -> Path:
        return self.save_dir / LAST

    def numbered_path(self, epoch: int, update: int) -> Path:
        return self.save_dir / f"checkpoint_{epoch}_{update}.pt"

    def best_k_path(self, value: float) -> Path:
        return self.save_dir / f"checkpoint.best_{self.metric}_{value:.4f}.pt"

    def save(
        self,
        state: dict[str, Any],
        *,
        epoch: int,
        update: int,
        numbered: bool,
        best_value: float | None,
    ) -> list[Path]:
        """Write checkpoint_last (always), a numbered one, and best ones when best_value is set.

        `state`'s tensors may live on a GPU: they are copied to the host once, here.
        """
        written = [self.last_path]
        if numbered:
            written.append(self.numbered_path(epoch, update))
        if best_value is not None:
            written.append(self.save_dir / BEST)
            if self.keep_best > 0:
                written.append(self.best_k_path(best_value))
        if "train_state" in state:  # the copies to make, kept for complete_copies
            copies = [path.name for path in written[1:]]
            state = {**state, "train_state": {**state["train_state"], COPIES: copies}}
        save_checkpoint(host_copy(state), self.last_path)
        try:
            for path in written[1:]:
                atomic_copy(self.last_path, path)
        except OSError as exc:
            raise NmtError(
                f"{self.save_dir}: could not write checkpoint files ({exc.strerror or exc}); "
                f"{LAST} is complete: {write_failure_hint(exc)}"
            ) from exc
        self.prune()
        return written

    def complete_copies(self, names: list[str], update: int) -> list[Path]:
        """Make the copies of checkpoint_last.pt (saved at `update`) that its save named
        but a kill cut short: a name that is missing, or that holds an earlier update (a
        checkpoint_best.pt not yet replaced). Never overwrites a later or unreadable file
        (a user's `cp` of an old checkpoint onto checkpoint_last.pt rewinds only that)."""
        made = []
        for name in names:
            path = self.save_dir / name
            saved = saved_update(path) if path.exists() else -1
            if saved is not None and saved < update:
                try:
                    atomic_copy(self.last_path, path)
                except OSError as exc:  # a full disk at start: one line, as in save()
                    raise NmtError(
                        f"{path}: could not write this copy of {LAST} ({exc.strerror or exc}); "
                        f"{LAST} is complete: {write_failure_hint(exc)}"
                    ) from exc
                made.append(path)
        if made:
            self.prune()  # a rewound run's old names may be past keep_last/keep_best again
        return [path for path in made if path.exists()]

    def remove_stale_temps(self) -> list[Path]:
        """Delete the temporaries a killed run left mid-write beside its checkpoints and
        config.yaml (call before this run saves; rank 0 is the one writer)."""
        targets = {LAST, BEST, CONFIG}
        for tmp in self.save_dir.glob(f".checkpoint*{TMP_SUFFIX}"):
            targets.add(tmp.name[1:].rsplit(".", 2)[0])  # .<name>.<random>.tmp -> <name>
        removed: list[Path] = []
        for name in sorted(targets):
            removed += remove_stale_temps(self.save_dir / name)
        return removed

    def numbered(self) -> list[tuple[int, Path]]:
        """Numbered checkpoints as (update, path), newest first."""
        found = []
        for path in self.save_dir.glob("checkpoint_*_*.pt"):
            m = _NUMBERED.match(path.name)
            if m:
                found.append((int(m.group(2)), path))
        return sorted(found, reverse=True)

    def best_k(self) -> list[tuple[float, Path]]:
        """keep_best checkpoints as (value, path), best first."""
        prefix = f"checkpoint.best_{self.metric}_"
        found = []
        for path in self.save_dir.glob(f"{prefix}*.pt"):
            try:
                found.append((float(path.name[len(prefix) : -3]), path))
            except ValueError:
                continue
        return sorted(found, key=lambda vp: vp[0], reverse=self.maximize)

    def prune(self) -> None:
        if self.keep_last >= 0:
            for _, path in self.numbered()[self.keep_last :]:
                path.unlink(missing_ok=True)
        for _, path in self.best_k()[max(self.keep_best, 0) :]:
            path.unlink(missing_ok=True)
