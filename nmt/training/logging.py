"""Training logs, written by rank 0 only: a tqdm bar, one-line summaries on stderr, a
JSON-lines file of every logged step and validation, and TensorBoard scalars.

Resuming appends to `train.jsonl` (never overwrites it) and tells TensorBoard to hide the
events a crashed run wrote after the checkpoint it resumes from (`purge_step`).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

# What the one-line summaries show, in order, and how.
_SHOWN = (
    ("loss", ".3f"),
    ("nll", ".3f"),
    ("ppl", ".2f"),
    ("bleu", ".2f"),
    ("kl", ".3f"),
    ("lr", ".3g"),
    ("budget", ".3f"),
    ("gnorm", ".3f"),
    ("tok_s", ".0f"),
    ("loss_scale", ".4g"),
)


def _fmt(metrics: dict[str, Any]) -> str:
    parts = []
    for key, spec in _SHOWN:
        value = metrics.get(key)
        if isinstance(value, (int, float)):
            parts.append(f"{key} {value:{spec}}")
    return " | ".join(parts)


class TrainLogger:
    """All of training's output channels; every method is a no-op when not enabled."""

    def __init__(
        self,
        save_dir: str | Path,
        *,
        enabled: bool,
        progress_bar: bool,
        tensorboard: bool,
        start_update: int,
    ) -> None:
        self.enabled = enabled
        self.progress_bar = progress_bar
        self.bar: tqdm | None = None
        self.writer = None
        self.jsonl = None
        if not enabled:
            return
        save_dir = Path(save_dir)
        save_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl = open(save_dir / "train.jsonl", "a", encoding="utf-8")
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # an extra: train.jsonl has every figure without it
                self.message(
                    "note: TensorBoard is not installed, so no tensorboard/ scalars "
                    "(train.jsonl is written as ever); pip install 'nmt[tensorboard]' to get "
                    "them, or turn tensorboard off"
                )
                return
            self.writer = SummaryWriter(
                str(save_dir / "tensorboard"), purge_step=start_update if start_update > 0 else None
            )

    def event(self, kind: str, **fields: Any) -> None:
        """One JSON line: {"type": kind, "time": ..., **fields}."""
        if self.jsonl is None:
            return
        record = {"type": kind, "time": round(time.time(), 3), **fields}
        self.jsonl.write(json.dumps(record, default=str) + "\n")
        self.jsonl.flush()

    def message(self, text: str) -> None:
        if self.enabled:
            tqdm.write(text, file=sys.stderr)

    def epoch_bar(self, epoch: int, total: int, initial: int) -> None:
        """A bar over the updates of one epoch (total and initial in updates)."""
        self.close_bar()
        if self.enabled and self.progress_bar:
            # disable=None: tqdm switches itself off when stderr is not a terminal.
            self.bar = tqdm(
                total=total,
                initial=initial,
                desc=f"epoch {epoch:03d}",
                leave=False,
                disable=None,
                dynamic_ncols=True,
                file=sys.stderr,
            )

    def advance(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def close_bar(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def train(self, update: int, epoch: int, metrics: dict[str, float]) -> None:
        """Logged every logging.interval updates: jsonl, TensorBoard, bar postfix, one line."""
        if not self.enabled:
            return
        self.event("train", update=update, epoch=epoch, **metrics)
        if self.writer is not None:
            for key, value in metrics.items():
                self.writer.add_scalar(f"train/{key}", value, update)
        if self.bar is not None:
            self.bar.set_postfix(
                {k: f"{metrics[k]:.3g}" for k in ("loss", "lr", "gnorm", "tok_s") if k in metrics},
                refresh=False,
            )
        self.message(f"epoch {epoch:03d} | update {update:6d} | {_fmt(metrics)}")

    def valid(self, update: int, epoch: int, metrics: dict[str, Any]) -> None:
        """A validation's figures; a multilingual run's have each direction's under
        `directions` (TensorBoard: valid/<direction>/<figure>, a line each)."""
        if not self.enabled:
            return
        self.event("valid", update=update, epoch=epoch, **metrics)
        directions: dict[str, dict[str, Any]] = metrics.get("directions") or {}
        if self.writer is not None:
            for key, value in metrics.items():
                if isinstance(value, (int, float)):
                    self.writer.add_scalar(f"valid/{key}", value, update)
            for direction, figures in directions.items():
                for key, value in figures.items():
                    if isinstance(value, (int, float)):
                        self.writer.add_scalar(f"valid/{direction}/{key}", value, update)
        head = f"epoch {epoch:03d} | update {update:6d} | valid"
        mean = " (mean)" if directions else ""
        self.message(f"{head}{mean} | {_fmt(metrics)}")
        for direction, figures in directions.items():
            self.message(f"{head} {direction} | {_fmt(figures)}")

    def close(self) -> None:
        self.close_bar()
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        if self.jsonl is not None:
            self.jsonl.close()
            self.jsonl = None
