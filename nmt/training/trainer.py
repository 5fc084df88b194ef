"""The training loop: batches -> forward/backward (AMP, accumulation, DDP) -> clipped Adam
step -> logging, validation, checkpoints, stopping.

An update consumes `world_size * update_freq` consecutive batches of the epoch's seeded
batch list; rank r runs every world_size-th of them. The loss of every micro-batch is a
sum over its target tokens divided by the update's total target tokens (known up front
from the sentence lengths, so no communication is needed), times world_size because DDP
averages gradients over ranks. Hence 2 ranks x update_freq 1 and 1 rank x update_freq 2
make the same update from the same batches, as fairseq does.

Resuming restores weights, optimizer, schedule offset, loss scaler, every RNG, the epoch
and the batch position inside it, counters, best metric and patience: on CPU in fp32 a
resumed run is bitwise equal to an uninterrupted one.
"""

from __future__ import annotations

import signal
import threading
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from nmt import distributed
from nmt.checkpoint import build_checkpoint, load_checkpoint, tensor_to_bytes
from nmt.data.batching import epoch_batches, filter_by_size, fixed_batches, rank_share
from nmt.data.collate import Batch, collate
from nmt.data.dataset import PairDataset, load_pair_dataset
from nmt.data.meta import DataMeta, load_meta
from nmt.data.vocab import PAD, SPECIAL_IDS
from nmt.distributed import DistEnv
from nmt.errors import NmtError
from nmt.model.transformer import Transformer
from nmt.training.checkpointing import BestTracker, CheckpointManager, rng_state, set_rng_state
from nmt.training.config import BEST_METRICS, PRECISIONS, TrainConfig
from nmt.training.logging import TrainLogger
from nmt.training.loss import output_layer_loss, per_token_base2, perplexity
from nmt.training.optim import LRScheduler, build_optimizer, schedule_function
from nmt.training.validation import valid_bleu, valid_loss

# Model settings that may change between a checkpoint and the run resuming from it.
RESUMABLE_MODEL_CHANGES = ("dropout", "attention_dropout", "activation_dropout")


@dataclass
class TrainResult:
    """How a run ended."""

    num_updates: int
    epoch: int  # the epoch the next update would belong to
    best: float | None  # best validation value of best_metric
    stop_reason: str  # max_update | max_epoch | max_time | patience | signal
    signal: int | None = None  # the signal number when stop_reason == "signal"


def check_config(cfg: TrainConfig) -> None:
    """Mistakes Hydra's type check cannot see, each naming its key."""
    if cfg.precision not in PRECISIONS:
        raise NmtError(f"precision={cfg.precision!r}: use one of {', '.join(PRECISIONS)}")
    if cfg.best_metric not in BEST_METRICS:
        raise NmtError(f"best_metric={cfg.best_metric!r}: use one of {', '.join(BEST_METRICS)}")
    if cfg.best_metric == "bleu" and not cfg.eval_bleu:
        raise NmtError("best_metric=bleu: needs eval_bleu=true")
    positive = {
        "max_tokens": cfg.max_tokens,
        "update_freq": cfg.update_freq,
        "log_interval": cfg.log_interval,
        "eval_bleu_beam": cfg.eval_bleu_beam,
    }
    for key, value in positive.items():
        if value < 1:
            raise NmtError(f"{key}={value}: must be 1 or more")
    non_negative = {
        "max_sentences": cfg.max_sentences,
        "valid_max_tokens": cfg.valid_max_tokens,
        "max_epoch": cfg.max_epoch,
        "max_update": cfg.max_update,
        "max_time": cfg.max_time,
        "patience": cfg.patience,
        "clip_norm": cfg.clip_norm,
        "threads": cfg.threads,
        "validate_interval_updates": cfg.validate_interval_updates,
        "save_interval_updates": cfg.save_interval_updates,
        "keep_best": cfg.keep_best,
        "eval_bleu_max_sentences": cfg.eval_bleu_max_sentences,
        "max_oom_skips": cfg.max_oom_skips,
    }
    for key, value in non_negative.items():
        if value < 0:
            raise NmtError(f"{key}={value}: must be 0 or more")
    if not 0.0 <= cfg.label_smoothing < 1.0:
        raise NmtError(f"label_smoothing={cfg.label_smoothing}: must be in [0, 1)")
    if cfg.keep_last < -1:
        raise NmtError(f"keep_last={cfg.keep_last}: use -1 (keep all) or 0 or more")


def resolve_device(cfg: TrainConfig, env: DistEnv) -> torch.device:
    if cfg.device == "auto":
        device = torch.device(f"cuda:{env.local_rank}" if torch.cuda.is_available() else "cpu")
    else:
        try:
            device = torch.device(cfg.device)
        except RuntimeError:
            raise NmtError(
                f"device={cfg.device!r}: not a device; use auto, cpu, cuda or cuda:N"
            ) from None
        if device.type == "cuda" and device.index is None:
            device = torch.device(f"cuda:{env.local_rank}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise NmtError(f"device={cfg.device}: no CUDA device is available; use device=cpu")
    if device.type not in ("cpu", "cuda"):
        raise NmtError(f"device={cfg.device}: nmt-train runs on cpu or cuda")
    if cfg.precision == "fp16" and device.type != "cuda":
        raise NmtError("precision=fp16: needs a CUDA device; use precision=bf16 on CPU")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


class StopSignals:
    """SIGINT/SIGTERM ask the loop to finish its update, save checkpoint_last and stop.

    A second signal of the same kind acts as it normally would (Ctrl-C twice aborts now;
    the checkpoint files stay complete because every write is atomic).
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
        self.received = signum
        signal.signal(signum, self._previous.get(signum, signal.SIG_DFL))
        self._notify(
            f"{signal.Signals(signum).name}: finishing this update, then saving "
            "checkpoint_last.pt (send it again to stop at once)"
        )

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def _meta_data_info(meta: DataMeta) -> dict[str, Any]:
    """The `data` entry of a checkpoint (see docs/ARCHITECTURE.md)."""
    return {
        "src_lang": meta.src_lang,
        "tgt_lang": meta.tgt_lang,
        "src_vocab_size": meta.src_vocab_size,
        "tgt_vocab_size": meta.tgt_vocab_size,
        "joint_vocab": meta.joint_vocab,
        "special_ids": dict(meta.special_ids),
        "normalization": dict(meta.normalization),
    }


class Trainer:
    """One training run of `cfg` on this process (one rank of a torchrun job, or alone)."""

    def __init__(self, cfg: TrainConfig, env: DistEnv | None = None) -> None:
        check_config(cfg)
        self.cfg = cfg
        self.env = env or distributed.env_from_environ()
        if cfg.threads > 0:
            torch.set_num_threads(cfg.threads)
        self.device = resolve_device(cfg, self.env)
        self.save_dir = Path(cfg.save_dir)
        self.logger = TrainLogger(
            self.save_dir, enabled=False, progress_bar=False, tensorboard=False, start_update=0
        )
        distributed.init_process_group(self.env, self.device, cfg.ddp_timeout)
        self._load_data()
        self._build_model()
        self.num_updates = 0
        self.epoch = 1
        self.position = 0  # batches of the epoch's list already consumed
        self.elapsed = 0.0  # training seconds of earlier runs (for max_time)
        self._restore()
        self.ddp = None
        if self.env.is_distributed:
            self.ddp = torch.nn.parallel.DistributedDataParallel(
                self.model,
                device_ids=[self.device] if self.device.type == "cuda" else None,
                # Buffers (position tables) are constants: no need to sync them every forward.
                forward_sync_buffers=False,
                gradient_as_bucket_view=True,
            )
        self.logger = TrainLogger(
            self.save_dir,
            enabled=self.env.is_main,
            progress_bar=cfg.progress_bar,
            tensorboard=cfg.tensorboard,
            start_update=self.num_updates,
        )
        for line in self._notes:
            self.logger.message(line)
        # Running figures since the last log line: summed loss and nll (this rank, device
        # tensors, no sync per update), gnorm sum, target tokens of all ranks, updates.
        self._interval = torch.zeros(3, dtype=torch.float64, device=self.device)
        self.oom_skips = 0  # updates dropped because a batch ran out of memory
        self._consecutive_ooms = 0
        self._interval_tokens = 0
        self._interval_updates = 0
        self._interval_start = time.monotonic()
        self._nonfinite_at = torch.full((), -1, dtype=torch.long, device=self.device)
        self._last_saved_update = self.num_updates if self.manager.last_path.exists() else -1

    # ---------------------------------------------------------------- setup

    def _load_data(self) -> None:
        cfg = self.cfg
        self.meta = meta = load_meta(cfg.data)
        meta_json = Path(cfg.data) / "meta.json"
        if meta.special_ids != SPECIAL_IDS:
            raise NmtError(
                f"{meta_json}: special_ids {meta.special_ids} differ from nmt's {SPECIAL_IDS}; "
                "rebuild the data dir with nmt-preprocess"
            )
        self.tokenizer_bytes = {}
        for side in ("src", "tgt"):
            path = meta.tokenizer_file(cfg.data, side)
            try:
                self.tokenizer_bytes[side] = path.read_bytes()
            except OSError as exc:
                raise NmtError(
                    f"{path}: cannot read the tokenizer named in {meta_json} "
                    f"({exc.strerror}); rebuild the data dir"
                ) from exc
        if cfg.train_split not in meta.splits:
            raise NmtError(
                f"train_split={cfg.train_split!r}: {meta_json} has splits "
                f"{sorted(meta.splits)}; choose one of them"
            )
        self.train_data = load_pair_dataset(cfg.data, cfg.train_split, meta.src_lang, meta.tgt_lang)
        m = cfg.model
        kept = filter_by_size(
            self.train_data.src_sizes,
            self.train_data.tgt_sizes,
            max_source_positions=m.max_source_positions,
            max_target_positions=m.max_target_positions,
            max_tokens=cfg.max_tokens,
        )
        self.train_indices = kept.kept
        self._notes = [
            f"train: {len(kept.kept)} of {len(self.train_data)} sentence pairs of "
            f"{self.train_data.name}"
        ]
        if kept.too_long:
            self._notes.append(
                f"train: skipped {kept.too_long} pairs longer than the model's "
                f"positions ({m.max_source_positions}/{m.max_target_positions})"
            )
        if kept.over_budget:
            self._notes.append(
                f"train: skipped {kept.over_budget} pairs longer than max_tokens={cfg.max_tokens}"
            )
        if len(kept.kept) == 0:
            raise NmtError(
                f"{self.train_data.name}: no usable training pairs (all longer than "
                "the model's positions or max_tokens); raise max_tokens or the positions"
            )
        self.valid_data: PairDataset | None = None
        if cfg.valid_split and cfg.valid_split in meta.splits:
            self.valid_data = load_pair_dataset(
                cfg.data, cfg.valid_split, meta.src_lang, meta.tgt_lang
            )
            v = self.valid_data
            too_long = (v.src_sizes > m.max_source_positions) | (
                v.tgt_sizes > m.max_target_positions
            )
            if too_long.any():
                first = int(np.flatnonzero(too_long)[0])
                raise NmtError(
                    f"{v.name}: {int(too_long.sum())} pairs (the first is line {first + 1}) "
                    f"are longer than the model's positions ({m.max_source_positions}/"
                    f"{m.max_target_positions}); raise model.max_*_positions or filter "
                    "the valid set in nmt-preprocess"
                )
            indices = np.arange(len(v), dtype=np.int64)
            self.valid_batches = fixed_batches(
                indices,
                v.src_sizes,
                v.tgt_sizes,
                max_tokens=cfg.valid_max_tokens or cfg.max_tokens,
                max_sentences=cfg.max_sentences,
            )
            n_bleu = cfg.eval_bleu_max_sentences or len(v)
            self.bleu_indices = indices[:n_bleu]
        elif cfg.valid_split:
            self._notes.append(
                f"valid: the data dir has no {cfg.valid_split!r} split; validation is off"
            )

    def _build_model(self) -> None:
        cfg, meta = self.cfg, self.meta
        if cfg.model.share_all_embeddings and not meta.joint_vocab:
            # equal sizes are not enough: id i is a different piece on each side
            raise NmtError(
                f"model.share_all_embeddings=true: {cfg.data} has separate source and "
                "target vocabularies; set it to false or preprocess with spm.joint=true"
            )
        cfg.model.validate(meta.src_vocab_size, meta.tgt_vocab_size, PAD)
        torch.manual_seed(cfg.seed)  # the same initial weights on every rank
        self.model = Transformer(
            cfg.model,
            src_vocab_size=meta.src_vocab_size,
            tgt_vocab_size=meta.tgt_vocab_size,
            pad_id=PAD,
        ).to(self.device)
        # Dropout draws from a stream of its own per rank (rank 0 of a job = a lone process).
        stream = int(np.random.SeedSequence([cfg.seed, self.env.rank]).generate_state(1)[0])
        torch.manual_seed(stream)
        np.random.seed(stream)
        self.optimizer = build_optimizer(self.model.parameters(), cfg.optim)
        self.scheduler = LRScheduler(self.optimizer, schedule_function(cfg.optim, cfg.max_update))
        self.scaler = torch.amp.GradScaler(
            self.device.type, init_scale=cfg.fp16_init_scale, enabled=cfg.precision == "fp16"
        )
        maximize = cfg.best_metric == "bleu"
        self.best = BestTracker(cfg.best_metric, maximize)
        self.manager = CheckpointManager(
            self.save_dir,
            keep_last=cfg.keep_last,
            keep_best=cfg.keep_best,
            metric=cfg.best_metric,
            maximize=maximize,
        )
        self.amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.precision)

    def _check_compatible(self, ckpt: dict[str, Any], path: Path, what: str) -> None:
        """The checkpoint's model and vocabulary must be the ones configured now."""
        saved, current = ckpt["model_config"], asdict(self.cfg.model)
        for key in sorted(set(saved) | set(current)):
            if key not in RESUMABLE_MODEL_CHANGES and saved.get(key) != current.get(key):
                raise NmtError(
                    f"{path}: was trained with model.{key}={saved.get(key)!r} but the config "
                    f"says {current.get(key)!r}; {what}"
                )
        data = ckpt.get("data", {})
        for key in ("src_vocab_size", "tgt_vocab_size"):
            if data.get(key) != getattr(self.meta, key):
                raise NmtError(
                    f"{path}: {key} {data.get(key)} differs from {self.cfg.data}'s "
                    f"{getattr(self.meta, key)}; {what}"
                )
        toks = ckpt.get("tokenizers", {})
        for side in ("src", "tgt"):
            if side in toks and tensor_to_bytes(toks[side]) != self.tokenizer_bytes[side]:
                raise NmtError(
                    f"{path}: its {side} tokenizer differs from the one in {self.cfg.data}; {what}"
                )

    def _restore(self) -> None:
        """Resume from checkpoint_last.pt, or start from finetune_from's weights."""
        cfg = self.cfg
        last = self.manager.last_path
        if last.exists():
            ckpt = load_checkpoint(last, map_location=self.device)
            self._check_compatible(
                ckpt, last, "use the same settings to resume, or another save_dir"
            )
            state = ckpt.get("train_state")
            if state is None:
                raise NmtError(
                    f"{last}: holds weights only (averaged or imported); start a new "
                    f"save_dir with finetune_from={last}"
                )
            self.model.load_state_dict(ckpt["model"])
            self._load_train_state(state)
            self._notes.append(
                f"resumed from {last} at update {self.num_updates} "
                f"(epoch {self.epoch}, batch {self.position})"
            )
        elif cfg.finetune_from:
            path = Path(cfg.finetune_from)
            ckpt = load_checkpoint(path, map_location=self.device)
            self._check_compatible(ckpt, path, "finetune with the same model and vocabulary")
            self.model.load_state_dict(ckpt["model"])
            self._notes.append(
                f"starting from the weights of {path} (fresh optimizer and counters)"
            )

    def _load_train_state(self, state: dict[str, Any]) -> None:
        cfg = self.cfg
        self.num_updates = int(state["num_updates"])
        self.elapsed = float(state.get("elapsed", 0.0))
        if not cfg.reset_optimizer:
            self.optimizer.load_state_dict(state["optimizer"])
            for group in self.optimizer.param_groups:  # the config's settings win, as in fairseq
                group.update(
                    betas=tuple(cfg.optim.betas),
                    eps=cfg.optim.eps,
                    weight_decay=cfg.optim.weight_decay,
                )
            if self.scaler.is_enabled() and state.get("scaler"):
                self.scaler.load_state_dict(state["scaler"])
        if cfg.reset_lr_scheduler:
            self.scheduler.restart(self.num_updates)
        else:
            self.scheduler.load_state_dict(state["lr_scheduler"])
        if not cfg.reset_dataloader:
            self.epoch = int(state["epoch"])
            self.position = int(state["position"])
        self.best.load_state_dict(state["best"])
        rngs = state["rng"]
        set_rng_state(rngs[self.env.rank] if self.env.rank < len(rngs) else rngs[0])

    # ---------------------------------------------------------------- the loop

    def run(self) -> TrainResult:
        """Train until a stopping rule fires; always leaves a resumable checkpoint_last.pt."""
        try:
            with StopSignals(self.logger.message) as signals:
                return self._train(signals)
        except Exception as exc:
            if self.env.is_distributed and distributed.is_collective_failure(exc):
                raise distributed.peer_error(
                    exc, self.env, f"near update {self.num_updates + 1}"
                ) from exc
            raise
        finally:
            self.logger.close()
            distributed.destroy_process_group()

    def _train(self, signals: StopSignals) -> TrainResult:
        cfg = self.cfg
        if self.env.is_main:
            self.save_dir.mkdir(parents=True, exist_ok=True)
            for path in self.manager.remove_stale_temps():  # left by a kill -9 mid-save
                self.logger.message(f"removed {path.name}, an unfinished checkpoint write")
            (self.save_dir / "config.yaml").write_text(yaml.safe_dump(asdict(cfg), sort_keys=False))
        self.logger.event(
            "start",
            update=self.num_updates,
            epoch=self.epoch,
            position=self.position,
            world_size=self.env.world_size,
            device=str(self.device),
            config=asdict(cfg),
        )
        self._run_start = time.monotonic()
        self._interval_start = self._run_start
        group_size = self.env.world_size * cfg.update_freq
        stop: str | None = None
        if cfg.max_update and self.num_updates >= cfg.max_update:
            stop = "max_update"
        elif cfg.max_epoch and self.epoch > cfg.max_epoch:
            stop = "max_epoch"
        while stop is None:
            batches = epoch_batches(
                self.train_indices,
                self.train_data.src_sizes,
                self.train_data.tgt_sizes,
                max_tokens=cfg.max_tokens,
                max_sentences=cfg.max_sentences,
                seed=cfg.seed,
                epoch=self.epoch,
            )
            if self.position >= len(batches):  # the batch list shrank since the checkpoint
                self.epoch, self.position = self.epoch + 1, 0
                continue
            self.logger.epoch_bar(
                self.epoch, -(-len(batches) // group_size), self.position // group_size
            )
            while stop is None:
                group = batches[self.position : self.position + group_size]
                self._train_step(group)
                self.position += len(group)
                end_of_epoch = self.position >= len(batches)
                finished_epoch = self.epoch
                if end_of_epoch:
                    self.epoch, self.position = self.epoch + 1, 0
                stop = self._after_update(signals, end_of_epoch, finished_epoch)
                if end_of_epoch:
                    break
        if self._last_saved_update != self.num_updates:
            self._save(numbered=False, best_value=None)
        self.logger.close_bar()
        self.logger.event(
            "stop",
            update=self.num_updates,
            epoch=self.epoch,
            reason=stop,
            best=self.best.best,
            oom_skipped=self.oom_skips,
        )
        best = "" if self.best.best is None else f"; best {cfg.best_metric} {self.best.best:.4f}"
        ooms = f"; {self.oom_skips} updates skipped (out of memory)" if self.oom_skips else ""
        self.logger.message(f"stopped ({stop}) after {self.num_updates} updates{best}{ooms}")
        return TrainResult(
            num_updates=self.num_updates,
            epoch=self.epoch,
            best=self.best.best,
            stop_reason=stop,
            signal=signals.received,
        )

    def _autocast(self):
        if self.amp_dtype is None:
            return nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.amp_dtype)

    def _collate(self, dataset: PairDataset, idx: np.ndarray) -> Batch:
        on_cuda = self.device.type == "cuda"
        return collate(idx, dataset.pairs(idx), pin_memory=on_cuda).to(self.device)

    def _train_step(self, group: list[np.ndarray]) -> None:
        """One optimizer update from `group` (all ranks' batches of this update)."""
        cfg = self.cfg
        model = self.ddp if self.ddp is not None else self.model
        model.train()
        # Target tokens of the whole update, over all ranks: known from the lengths alone.
        total_tokens = int(self.train_data.tgt_sizes[np.concatenate(group)].sum())
        share = rank_share(group, self.env.rank, self.env.world_size)
        try:
            loss_sums = self._forward_backward(model, group, share, total_tokens)
        except torch.OutOfMemoryError:
            self._skip_out_of_memory(group, total_tokens)
            return
        self._consecutive_ooms = 0
        self._interval[:2] += loss_sums

        params = [p for p in self.model.parameters() if p.grad is not None]
        self.scaler.unscale_(self.optimizer)  # gnorm and clipping see the true gradients
        grads = [p.grad for p in params]
        gnorm = torch.nn.utils.get_total_norm(grads)
        if cfg.clip_norm > 0:
            torch.nn.utils.clip_grads_with_norm_(params, cfg.clip_norm, gnorm)
        self.lr = self.scheduler.step(self.num_updates)
        if self.scaler.is_enabled():
            scale_before = self.scaler.get_scale()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            skipped = self.scaler.get_scale() < scale_before
        else:
            self.optimizer.step()
            skipped = False
        self.optimizer.zero_grad(set_to_none=True)
        self._interval_tokens += total_tokens
        if skipped:
            self._overflow(scale_before)
            return
        self.num_updates += 1
        self._interval_updates += 1
        self._interval[2] += gnorm.double()
        # Remember the first update with a non-finite gradient without a device sync.
        self._nonfinite_at = torch.where(
            (self._nonfinite_at < 0) & ~torch.isfinite(gnorm),
            torch.full_like(self._nonfinite_at, self.num_updates),
            self._nonfinite_at,
        )
        if self.device.type == "cpu":  # a sync is free on CPU: stop at the very update
            self._check_finite()

    def _forward_backward(
        self, model: torch.nn.Module, group: list[np.ndarray], share: list, total_tokens: int
    ) -> torch.Tensor:
        """Gradients of this rank's share of an update; returns its [loss, nll] sums."""
        cfg = self.cfg
        scale = self.env.world_size / total_tokens  # DDP divides the summed gradient by world_size
        sums = torch.zeros(2, dtype=torch.float64, device=self.device)
        for i, idx in enumerate(share):
            dummy = idx is None  # a short share: run a real batch with weight 0 to keep DDP in step
            batch = self._collate(self.train_data, group[0] if dummy else idx)
            last = i == len(share) - 1
            sync = nullcontext() if (self.ddp is None or last) else self.ddp.no_sync()
            with sync:
                with self._autocast():
                    features = model(
                        batch.src_tokens, batch.prev_tokens, features_only=True
                    )  # [B,T,D]
                    out = output_layer_loss(
                        features, self.model.output_weight, batch.target, cfg.label_smoothing, PAD
                    )
                self.scaler.scale(out.loss * (0.0 if dummy else scale)).backward()
            if not dummy:
                sums[0] += out.loss.detach()
                sums[1] += out.nll.detach()
        return sums

    def _skip_out_of_memory(self, group: list[np.ndarray], tokens: int) -> None:
        """fairseq's behaviour: drop the update whose batch ran out of memory, count it, and
        go on; stop when it keeps happening (the batches are simply too big)."""
        self.optimizer.zero_grad(set_to_none=True)  # partial gradients of the failed update
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        sentences = sum(len(idx) for idx in group)
        where = f"update {self.num_updates + 1} ({sentences} sentences, {tokens} target tokens)"
        if self.env.is_distributed:  # the other ranks are already inside the gradient all-reduce
            raise NmtError(
                f"rank {self.env.rank}/{self.env.world_size}: out of memory in {where}; "
                "lower max_tokens (or raise update_freq to keep the effective batch)"
            )
        self.oom_skips += 1
        self._consecutive_ooms += 1
        self.logger.event(
            "oom",
            update=self.num_updates + 1,
            sentences=sentences,
            tokens=tokens,
            skipped_total=self.oom_skips,
        )
        self.logger.message(
            f"out of memory in {where}: skipped it ({self.oom_skips} skipped so far)"
        )
        if self._consecutive_ooms > self.cfg.max_oom_skips:
            raise NmtError(
                f"out of memory in {self._consecutive_ooms} updates in a row, the last "
                f"{where}: lower max_tokens (or raise update_freq to keep the effective "
                f"batch); max_oom_skips={self.cfg.max_oom_skips}"
            )

    def _overflow(self, scale_before: float) -> None:
        scale = self.scaler.get_scale()
        self.logger.message(
            f"fp16: gradient overflow in update {self.num_updates + 1}; skipped it, "
            f"loss scale {scale_before:g} -> {scale:g}"
        )
        if scale < self.cfg.fp16_min_scale:
            raise NmtError(
                f"precision=fp16: the loss scale fell below fp16_min_scale="
                f"{self.cfg.fp16_min_scale:g} at update {self.num_updates + 1}; the run "
                "diverges: lower optim.lr, set clip_norm, or use precision=bf16"
            )

    def _check_finite(self) -> None:
        bad = int(self._nonfinite_at)
        if bad >= 0:
            raise NmtError(
                f"update {bad}: the loss or gradient is not finite (NaN/inf) in "
                f"precision={self.cfg.precision}; checkpoint_last.pt holds the last good "
                "state: lower optim.lr, set clip_norm, or raise optim.warmup_updates"
            )

    def _agree_to_stop(self, signals: StopSignals) -> tuple[bool, bool]:
        """(signal seen, time up), agreed by all ranks so that they stop at the same update."""
        time_up = bool(self.cfg.max_time) and self._hours() >= self.cfg.max_time
        if not self.env.is_distributed:
            return signals.received is not None, time_up
        flags = torch.tensor(
            [float(signals.received is not None), float(time_up)], device=self.device
        )
        distributed.all_reduce_max(flags)
        got_signal, time_up = (bool(v) for v in flags.tolist())
        if got_signal and signals.received is None:
            signals.received = int(signal.SIGTERM)  # another rank got it
        return got_signal, time_up

    def _hours(self) -> float:
        return (self.elapsed + time.monotonic() - self._run_start) / 3600.0

    def _after_update(
        self, signals: StopSignals, end_of_epoch: bool, finished_epoch: int
    ) -> str | None:
        """Logging, validation, checkpoints and the stopping rules after one update."""
        cfg = self.cfg
        u = self.num_updates
        self.logger.advance()
        stop = None
        got_signal, time_up = self._agree_to_stop(signals)
        if got_signal:
            stop = "signal"
        elif cfg.max_update and u >= cfg.max_update:
            stop = "max_update"
        elif end_of_epoch and cfg.max_epoch and finished_epoch >= cfg.max_epoch:
            stop = "max_epoch"
        elif time_up:
            stop = "max_time"
        if (u % cfg.log_interval == 0 or end_of_epoch or stop) and self._interval_updates:
            self._log_train(finished_epoch)
        do_valid = (
            self.valid_data is not None
            and stop != "signal"
            and (
                (cfg.validate_interval_updates and u % cfg.validate_interval_updates == 0)
                or (end_of_epoch and cfg.validate_every_epoch)
                or stop in ("max_update", "max_time")
            )
        )
        best_value = None
        if do_valid:
            metrics = self.validate()
            value = metrics[cfg.best_metric]
            if self.best.update(value):
                best_value = value
            metrics["best"] = self.best.best
            self.logger.valid(u, finished_epoch, metrics)
            if cfg.patience and self.best.bad_validations >= cfg.patience and stop is None:
                stop = "patience"
                self.logger.message(
                    f"patience: {cfg.best_metric} did not improve in {cfg.patience} validations"
                )
        numbered = end_of_epoch or bool(
            cfg.save_interval_updates and u % cfg.save_interval_updates == 0
        )
        if numbered or best_value is not None or stop:
            self._save(numbered=numbered, best_value=best_value, epoch=finished_epoch)
        return stop

    def _log_train(self, epoch: int) -> None:
        self._check_finite()
        sums = distributed.all_reduce_sum(self._interval[:2].clone()).tolist()
        gnorm_sum = float(self._interval[2])
        tokens = self._interval_tokens
        seconds = max(time.monotonic() - self._interval_start, 1e-9)
        nll = per_token_base2(sums[1], tokens)
        metrics = {
            "loss": per_token_base2(sums[0], tokens),
            "nll": nll,
            "ppl": perplexity(nll),
            "lr": self.lr,
            "gnorm": gnorm_sum / max(self._interval_updates, 1),
            "tok_s": tokens / seconds,
            "tokens": tokens,
            "wall": round(self._hours() * 3600, 1),
        }
        if self.scaler.is_enabled():
            metrics["loss_scale"] = float(self.scaler.get_scale())
        self.logger.train(self.num_updates, epoch, metrics)
        self._interval.zero_()
        self._interval_tokens = 0
        self._interval_updates = 0
        self._interval_start = time.monotonic()

    def validate(self) -> dict[str, float]:
        """Valid loss (and BLEU) of the current weights, reduced over ranks."""
        assert self.valid_data is not None
        self._check_finite()
        cfg = self.cfg
        start = time.monotonic()
        self.model.eval()
        try:
            mine = self.valid_batches[self.env.rank :: self.env.world_size]
            metrics = valid_loss(
                self.model,
                self.valid_data,
                mine,
                device=self.device,
                autocast=self._autocast,
                label_smoothing=cfg.label_smoothing,
            )
            if cfg.eval_bleu:
                metrics["bleu"], signature = valid_bleu(
                    self.model,
                    self.valid_data,
                    self.bleu_indices,
                    self._tgt_tokenizer(),
                    device=self.device,
                    autocast=self._autocast,
                    max_tokens=cfg.valid_max_tokens or cfg.max_tokens,
                    rank=self.env.rank,
                    world_size=self.env.world_size,
                    beam=cfg.eval_bleu_beam,
                    len_a=cfg.eval_bleu_len_a,
                    len_b=cfg.eval_bleu_len_b,
                )
                metrics["bleu_signature"] = signature
        finally:
            self.model.train()
        metrics["seconds"] = round(time.monotonic() - start, 2)
        # Validation time is not training time: do not let it lower the next tok/s figure.
        self._interval_start += time.monotonic() - start
        return metrics

    def _tgt_tokenizer(self):
        if not hasattr(self, "_tgt_tok"):
            from nmt.data.tokenizer import Tokenizer

            self._tgt_tok = Tokenizer.from_bytes(self.tokenizer_bytes["tgt"])
        return self._tgt_tok

    # ---------------------------------------------------------------- checkpoints

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint of the current state (see docs/ARCHITECTURE.md)."""
        cfg = self.cfg
        train_state = {
            "num_updates": self.num_updates,
            "epoch": self.epoch,  # the epoch the next batch belongs to
            "position": self.position,  # batches of that epoch's list already consumed
            "seed": cfg.seed,
            "optimizer": self.optimizer.state_dict(),
            "lr_scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "rng": distributed.all_gather_objects(rng_state()),  # one entry per rank
            "best": self.best.state_dict(),
            "elapsed": self._hours() * 3600.0,
            "world_size": self.env.world_size,
            "update_freq": cfg.update_freq,
        }
        return build_checkpoint(
            model_state=self.model.state_dict(),
            model_config=asdict(cfg.model),
            data=_meta_data_info(self.meta),
            src_tokenizer=self.tokenizer_bytes["src"],
            tgt_tokenizer=self.tokenizer_bytes["tgt"],
            train_state=train_state,
            config=asdict(cfg),
        )

    def _save(self, *, numbered: bool, best_value: float | None, epoch: int | None = None) -> None:
        if self.cfg.no_save:
            return
        self._check_finite()  # never overwrite a good checkpoint with NaN weights
        state = self.state_dict()  # a collective (RNG states): every rank builds it
        if self.env.is_main:
            written = self.manager.save(
                state,
                epoch=self.epoch if epoch is None else epoch,
                update=self.num_updates,
                numbered=numbered,
                best_value=best_value,
            )
            self.logger.event("save", update=self.num_updates, files=[p.name for p in written])
        self._last_saved_update = self.num_updates
