"""The training loop: epochs of seeded batch lists, one update per group of batches, and
after each update the logging, validation and checkpoint cadence and the stopping rules
(max_update, max_epoch, max_time, patience, SIGINT/SIGTERM).
"""

from __future__ import annotations

import signal
import threading
from dataclasses import asdict, dataclass
from typing import Any

import yaml

from nmt import distributed
from nmt.fsutil import atomic_write_text
from nmt.training import state, step, validation
from nmt.training.trainer import Trainer, training_seconds


@dataclass
class TrainResult:
    """How a run ended."""

    num_updates: int
    epoch: int  # the epoch the next update would belong to
    best: float | None  # best validation value of best_metric
    stop_reason: str  # max_update | max_epoch | max_time | patience | signal
    signal: int | None = None  # the signal number when stop_reason == "signal"


class StopSignals:
    """SIGINT/SIGTERM ask the loop to finish its update, save checkpoint_last and stop.

    A second Ctrl-C (SIGINT) acts as it normally would: it aborts now (the checkpoint files
    stay complete because every write is atomic). A repeated SIGTERM is only noted: job
    schedulers and launchers send it more than once (Slurm signals every process of the
    job step and torchrun forwards its own), and the save must not be cut short by an echo;
    a scheduler that will not wait sends SIGKILL after its grace period anyway.
    """

    def __init__(self, notify) -> None:
        self.received: int | None = None
        self._notify = notify
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.received is not None and signum == signal.SIGTERM:
            self._notify("SIGTERM again: still saving checkpoint_last.pt, then stopping")
            return
        self.received = signum
        if signum == signal.SIGINT:
            signal.signal(signum, self._previous.get(signum, signal.SIG_DFL))
            again = " (Ctrl-C again to stop at once)"
        else:
            again = ""
        self._notify(
            f"{signal.Signals(signum).name}: finishing this update, then saving "
            f"checkpoint_last.pt{again}"
        )

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def run(t: Trainer) -> TrainResult:
    """Train until a stopping rule fires; always leaves a resumable checkpoint_last.pt."""
    finished = False
    try:
        with StopSignals(t.logger.message) as signals:
            result = _train(t, signals)
        finished = True
        return result
    except Exception as exc:
        if t.env.is_distributed and distributed.is_collective_failure(exc):
            where = f"near update {t.progress.num_updates + 1}"
            raise distributed.peer_error(exc, t.env, where) from exc
        raise
    finally:
        with t.run_lock:  # released last: the run has stopped writing into save_dir
            t.logger.close()
            # DDP's reducer holds the process group: release it first, so that nothing of
            # the group outlives destroy_process_group (to be torn down at interpreter exit,
            # while the peers' connections close). After a clean end, wait for every rank
            # before leaving the job; after a failure, for nobody (a peer may be gone).
            t.ddp = None
            distributed.destroy_process_group(wait_for_peers=finished)


def prepare_run_dir(t: Trainer) -> None:
    """Rank 0: remove what a killed run left mid-write, make the checkpoint copies it left
    unmade; save the resolved config."""
    if not t.env.is_main:
        return
    t.checkpoints.save_dir.mkdir(parents=True, exist_ok=True)
    for path in t.checkpoints.remove_stale_temps():
        t.logger.message(f"removed {path.name}, an unfinished write")
    # a kill between checkpoint_last.pt's write and its copies left some unmade
    for path in t.checkpoints.complete_copies(t.copies_of_last, t.progress.num_updates):
        t.logger.message(
            f"wrote {path.name}, a copy of {t.checkpoints.last_path.name} that a killed run left unmade"
        )
    config = yaml.safe_dump(asdict(t.cfg), sort_keys=False)
    atomic_write_text(t.checkpoints.save_dir / "config.yaml", config)


def _train(t: Trainer, signals: StopSignals) -> TrainResult:
    cfg, progress = t.cfg, t.progress
    prepare_run_dir(t)
    t.logger.event(
        "start",
        update=progress.num_updates,
        epoch=progress.epoch,
        position=progress.position,
        world_size=t.env.world_size,
        device=str(t.device),
        config=asdict(cfg),
    )
    t.meter.start_run()
    group_size = t.env.world_size * cfg.update_freq
    stop: str | None = None
    if cfg.max_update and progress.num_updates >= cfg.max_update:
        stop = "max_update"
    elif cfg.max_epoch and progress.epoch > cfg.max_epoch:
        stop = "max_epoch"
    elif cfg.max_time and progress.elapsed / 3600.0 >= cfg.max_time:
        stop = "max_time"  # spent by earlier starts (the checkpoint's: every rank agrees)
    while stop is None:
        batches = t.data.epoch_batches(progress.epoch)
        if progress.position >= len(batches):  # the batch list shrank since the checkpoint
            progress.epoch, progress.position = progress.epoch + 1, 0
            continue
        t.logger.epoch_bar(
            progress.epoch, -(-len(batches) // group_size), progress.position // group_size
        )
        while stop is None:
            group = batches[progress.position : progress.position + group_size]
            step.train_step(t, group)
            progress.position += len(group)
            end_of_epoch = progress.position >= len(batches)
            finished_epoch = progress.epoch
            if end_of_epoch:
                progress.epoch, progress.position = progress.epoch + 1, 0
            stop = after_update(t, signals, end_of_epoch, finished_epoch)
            if end_of_epoch:
                break
    if t.last_saved_update != progress.num_updates:
        state.save(t, numbered=False, best_value=None)
    t.logger.close_bar()
    t.logger.event(
        "stop",
        update=progress.num_updates,
        epoch=progress.epoch,
        reason=stop,
        best=t.best.best,
        oom_skipped=t.oom_skips,
    )
    tracked = validation.tracked_name(cfg)
    best = "" if t.best.best is None else f"; best {tracked} {t.best.best:.4f}"
    ooms = f"; {t.oom_skips} updates skipped (out of memory)" if t.oom_skips else ""
    t.logger.message(f"stopped ({stop}) after {progress.num_updates} updates{best}{ooms}")
    return TrainResult(
        num_updates=progress.num_updates,
        epoch=progress.epoch,
        best=t.best.best,
        stop_reason=stop,
        signal=signals.received,
    )


def after_update(
    t: Trainer, signals: StopSignals, end_of_epoch: bool, finished_epoch: int
) -> str | None:
    """Logging, validation, checkpoints and the stopping rules after one update; returns
    why the run stops now, or None."""
    cfg = t.cfg
    u = t.progress.num_updates
    t.logger.advance()
    stop = None
    got_signal, time_up = _agree_to_stop(t, signals)
    if got_signal:
        stop = "signal"
    elif cfg.max_update and u >= cfg.max_update:
        stop = "max_update"
    elif end_of_epoch and cfg.max_epoch and finished_epoch >= cfg.max_epoch:
        stop = "max_epoch"
    elif time_up:
        stop = "max_time"
    if (u % cfg.logging.interval == 0 or end_of_epoch or stop) and t.meter.updates:
        log_train(t, finished_epoch)
    do_valid = (
        bool(t.data.valid_sets)
        and stop != "signal"
        and (
            (cfg.validation.interval_updates and u % cfg.validation.interval_updates == 0)
            or (end_of_epoch and cfg.validation.every_epoch)
            or stop in ("max_update", "max_time")
        )
    )
    best_value = None
    if do_valid:
        metrics = validation.validate(t)
        value = validation.tracked_value(metrics, cfg)
        if t.best.update(value):
            best_value = value
        metrics["best"] = t.best.best
        t.logger.valid(u, finished_epoch, metrics)
        if (
            cfg.validation.patience
            and t.best.bad_validations >= cfg.validation.patience
            and stop is None
        ):
            stop = "patience"
            t.logger.message(
                f"patience: {validation.tracked_name(cfg)} did not improve in "
                f"{cfg.validation.patience} validations"
            )
    state.save_after_update(
        t,
        end_of_epoch=end_of_epoch,
        epoch=finished_epoch,
        best_value=best_value,
        stop=stop,
    )
    return stop


def _agree_to_stop(t: Trainer, signals: StopSignals) -> tuple[bool, bool]:
    """(signal seen, time up), agreed by all ranks so that they stop at the same update
    (on the host: the GPUs keep their queues of work)."""
    time_up = bool(t.cfg.max_time) and training_seconds(t) / 3600.0 >= t.cfg.max_time
    if not t.env.is_distributed:
        return signals.received is not None, time_up
    flags = distributed.all_reduce_host([int(signals.received is not None), int(time_up)], "max")
    got_signal, time_up = bool(flags[0]), bool(flags[1])
    if got_signal and signals.received is None:
        signals.received = int(signal.SIGTERM)  # another rank got it
    return got_signal, time_up


def log_train(t: Trainer, epoch: int) -> None:
    """The figures since the last log line, to every log channel (a collective)."""
    metrics: dict[str, float] = t.meter.summary()
    metrics["wall"] = round(training_seconds(t), 1)
    if t.scheduler.by_time:  # the share of max_time the latest update's lr was set at
        metrics["budget"] = t.meter.schedule_position
    if t.scaler.enabled:
        metrics["loss_scale"] = t.scaler.scale
    t.logger.train(t.progress.num_updates, epoch, metrics)
