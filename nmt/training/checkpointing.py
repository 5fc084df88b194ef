"""The checkpoint manager: which files a run writes, which it keeps, and RNG state capture.

Files in the run dir:
    checkpoint_last.pt                 every save; what a re-run resumes from
    checkpoint_best.pt                 the best validation so far (best_metric)
    checkpoint_<epoch>_<update>.pt     at epoch ends and every save_interval_updates;
                                       the newest keep_last are kept
    checkpoint.best_<metric>_<v>.pt    the keep_best best validations
The state is serialised once (atomically, by nmt.checkpoint.save_checkpoint); the other
names are hard links to that file, put in place by an atomic rename as well, so a kill at
any moment leaves every name pointing at a complete checkpoint. Temporaries follow
nmt.fsutil's naming (`.<name>.<random>.tmp`); the next run removes what a kill left.
"""

from __future__ import annotations

import math
import os
import random
import re
import secrets
import shutil
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from nmt.checkpoint import save_checkpoint
from nmt.errors import NmtError
from nmt.fsutil import TMP_SUFFIX, fsync_dir, remove_stale_temps

LAST = "checkpoint_last.pt"
BEST = "checkpoint_best.pt"
CONFIG = "config.yaml"  # the run's resolved config, written at each start
_NUMBERED = re.compile(r"^checkpoint_(\d+)_(\d+)\.pt$")


def rng_state() -> dict[str, Any]:
    """Every RNG training touches, as tensors and plain values (weights_only-loadable)."""
    legacy_state = cast(tuple[str, np.ndarray, int, int, float], np.random.get_state())
    np_kind, np_keys, np_pos, np_has_gauss, np_gauss = legacy_state
    py_version, py_state, py_gauss = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
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


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    n = state["numpy"]
    np.random.set_state(
        (n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"])
    )
    p = state["python"]
    random.setstate((p["version"], tuple(int(v) for v in p["state"].tolist()), p["gauss"]))


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
        if state.get("metric") == self.metric:  # a changed best_metric starts afresh
            self.best = state["best"]
            self.bad_validations = int(state["bad_validations"])


def _link_atomic(src: Path, dst: Path) -> None:
    """Make `dst` a complete copy of `src` (hard link, or copy) via a temp name and rename."""
    tmp = dst.with_name(f".{dst.name}.{secrets.token_hex(4)}{TMP_SUFFIX}")  # fsutil's naming
    try:
        try:
            os.link(src, tmp)
        except OSError:  # file systems without hard links
            shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


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
        """Write checkpoint_last (always), a numbered one, and best ones when best_value is set."""
        save_checkpoint(state, self.last_path)
        written = [self.last_path]
        try:
            if numbered:
                written.append(self.numbered_path(epoch, update))
            if best_value is not None:
                written.append(self.save_dir / BEST)
                if self.keep_best > 0:
                    written.append(self.best_k_path(best_value))
            for path in written[1:]:
                _link_atomic(self.last_path, path)
            fsync_dir(self.save_dir)
        except OSError as exc:
            raise NmtError(
                f"{self.save_dir}: could not write checkpoint files ({exc.strerror or exc}); "
                f"{LAST} is complete"
            ) from exc
        self.prune()
        return written

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
