"""Checkpoint averaging (nmt-average, fairseq's scripts/average_checkpoints.py): pick a run's
newest or best checkpoints, or take listed files, and write one checkpoint whose weights are
their mean: of the trained weights, or (weights=ema) of the moving averages a run with
checkpoint.ema_decay > 0 keeps in its checkpoints. The result has no train_state: start a new run
from it with resume.finetune_from=.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from nmt.checkpoint import check_checkpoint_output, load_checkpoint, save_checkpoint
from nmt.errors import NmtError
from nmt.training.checkpointing import CheckpointManager
from nmt.training.config import BEST_METRICS, AverageConfig

_NUMBERED = "numbered checkpoints (checkpoint_<epoch>_<update>.pt, kept: checkpoint.keep_last)"
_BEST = "checkpoint.best_<metric>_<value>.pt files (kept: checkpoint.keep_best)"


@dataclass
class AverageResult:
    inputs: list[Path]  # the averaged checkpoints, newest (or best) first
    output: Path


def average(cfg: AverageConfig) -> AverageResult:
    """nmt-average's work: select, average, write `output` atomically."""
    cfg.validate()
    paths = [Path(p) for p in cfg.input_paths()]
    suffix = "_ema" if cfg.weights == "ema" else ""
    if cfg.last_fraction:
        run_dir = paths[0]
        inputs = select_last_fraction(run_dir, cfg.last_fraction)
        kind = f"last{round(cfg.last_fraction * 100)}pct"
        output = Path(cfg.output or run_dir / f"checkpoint_avg_{kind}{suffix}.pt")
    elif cfg.num_last or cfg.num_best:
        run_dir = paths[0]
        inputs = select_checkpoints(run_dir, num_last=cfg.num_last, num_best=cfg.num_best)
        kind = f"last{cfg.num_last}" if cfg.num_last else f"best{cfg.num_best}"
        output = Path(cfg.output or run_dir / f"checkpoint_avg_{kind}{suffix}.pt")
    else:
        for path in paths:
            if path.is_dir():
                raise NmtError(
                    f"inputs={path}: a run dir; pick its checkpoints with num_last=K or "
                    "num_best=K (or last_fraction=F), or list checkpoint files"
                )
        inputs = paths
        output = Path(cfg.output or paths[0].with_name(f"checkpoint_avg{suffix}.pt"))
    if any(output.resolve() == p.resolve() for p in inputs):
        raise NmtError(f"output={output}: is one of the inputs; write the average elsewhere")
    # a re-run replaces its own earlier average, never a training checkpoint or other file
    check_checkpoint_output(output, "output", "nmt-average", "averaged_from", overwrite=True)
    save_checkpoint(average_checkpoints(inputs, weights=cfg.weights), output)
    return AverageResult(inputs=inputs, output=output)


def select_checkpoints(run_dir: Path, *, num_last: int = 0, num_best: int = 0) -> list[Path]:
    """The `num_last` newest numbered checkpoints of `run_dir`, or its `num_best` best ones;
    newest (or best) first."""
    if not run_dir.is_dir():
        raise NmtError(f"{run_dir}: no such run dir; give the save_dir of a training run")
    if num_last:
        manager = CheckpointManager(run_dir, keep_last=-1, keep_best=0, metric="", maximize=False)
        found, what, want = [p for _, p in manager.numbered()], _NUMBERED, num_last
    else:
        by_metric = {}
        for metric in BEST_METRICS:
            manager = CheckpointManager(
                run_dir, keep_last=-1, keep_best=0, metric=metric, maximize=metric == "bleu"
            )
            if manager.best_k():
                by_metric[metric] = [p for _, p in manager.best_k()]
        if len(by_metric) > 1:
            raise NmtError(
                f"{run_dir}: holds best checkpoints of several metrics ({', '.join(by_metric)}); "
                "list the files to average in inputs=[...]"
            )
        found = next(iter(by_metric.values()), [])
        what, want = _BEST, num_best
    if len(found) < want:
        raise NmtError(f"{run_dir}: asked for {want} but found {len(found)} {what}; ask for fewer")
    return found[:want]


def select_last_fraction(run_dir: Path, fraction: float) -> list[Path]:
    """The numbered checkpoints of `run_dir` from the last `fraction` of its updates
    (update >= (1 - fraction) x the newest one's), newest first.

    A window in shares of the run, unlike num_last, covers the same part of training
    whether the run held 20 epochs or 50 (the recipe's hour on a slow or a fast machine).
    Checkpoints that keep_last already deleted cannot be averaged: when the one before the
    oldest kept would have been inside the window (judged from the spacing of the two
    oldest), the window is incomplete, and that is an error rather than a quieter average.
    """
    if not run_dir.is_dir():
        raise NmtError(f"{run_dir}: no such run dir; give the save_dir of a training run")
    manager = CheckpointManager(run_dir, keep_last=-1, keep_best=0, metric="", maximize=False)
    numbered = manager.numbered()  # [(update, path)], newest first
    if not numbered:
        raise NmtError(f"{run_dir}: found no {_NUMBERED}; train first, or list files to average")
    start = (1 - fraction) * numbered[0][0]  # the first update inside the window
    inside = [(u, p) for u, p in numbered if u >= start]
    if len(inside) == len(numbered) >= 2:
        oldest, spacing = numbered[-1][0], numbered[-2][0] - numbered[-1][0]
        if oldest - spacing >= max(start, 1):
            raise NmtError(
                f"last_fraction={fraction}: the window starts at update {start:.0f}, but "
                f"{run_dir}'s oldest numbered checkpoint is from update {oldest} "
                "(checkpoint.keep_last deleted the ones before); train with a larger "
                "checkpoint.keep_last, or ask for less"
            )
    return [p for _, p in inside]


def average_checkpoints(paths: list[Path], weights: str = "model") -> dict[str, Any]:
    """One checkpoint whose weights are the mean of `paths`' (first = the newest/best)
    trained weights, or with weights="ema" of their moving averages of the weights.

    All inputs must share model config, vocabulary and tokenizers; the result keeps the
    first one's inference part, drops train_state (it resumes nothing) and has
    config = {averaged_from: [paths], weights, training_config: the first one's config}.
    """
    if not paths:
        raise NmtError("inputs=[]: no checkpoints to average; list one or more")
    first = load_checkpoint(paths[0])
    first_weights = checkpoint_weights(first, paths[0], weights)
    sums = {k: v.double() for k, v in first_weights.items() if v.is_floating_point()}
    for path in paths[1:]:
        ckpt = load_checkpoint(path)
        for key in ("model_config", "data"):
            if ckpt[key] != first[key]:
                raise NmtError(
                    f"{path}: its {key} differs from {paths[0]}'s; average checkpoints of one run"
                )
        if any(
            not torch.equal(ckpt["tokenizers"][s], first["tokenizers"][s]) for s in ("src", "tgt")
        ):
            raise NmtError(
                f"{path}: its tokenizer differs from {paths[0]}'s; average checkpoints of one run"
            )
        ckpt_weights = checkpoint_weights(ckpt, path, weights)
        for k in sums:
            sums[k] += ckpt_weights[k].double()
    model = dict(first_weights)
    for k, total in sums.items():
        model[k] = (total / len(paths)).to(first_weights[k].dtype)
    averaged = {k: v for k, v in first.items() if k != "train_state"}
    averaged["model"] = model
    # As imported checkpoints do: `config` says where the weights came from.
    averaged["config"] = {
        "averaged_from": [str(p) for p in paths],
        "weights": weights,
        "training_config": first.get("config"),
    }
    return averaged


def checkpoint_weights(ckpt: dict[str, Any], path: Path, weights: str) -> dict[str, Any]:
    """The state dict `weights` names in `ckpt`: its trained weights ("model"), or the
    moving average a run with checkpoint.ema_decay > 0 saved in its train_state ("ema")."""
    if weights == "model":
        return ckpt["model"]
    ema = (ckpt.get("train_state") or {}).get("ema")
    if ema is None:
        raise NmtError(
            f"{path}: holds no moving average of its weights (weights=ema reads the "
            "checkpoints of a run trained with checkpoint.ema_decay > 0); use weights=model"
        )
    return ema["weights"]
