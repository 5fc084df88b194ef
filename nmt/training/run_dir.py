"""The run dir (save_dir): where it may be, and the lock that makes one run its only writer.

Two nmt-train runs on one save_dir would delete each other's temporary checkpoints and
interleave their lines in train.jsonl. So rank 0, the one writer, holds an exclusive lock
on `<save_dir>/.nmt-train.lock` (nmt.fsutil.exclusive_lock: an flock) from before it
writes anything until the run ends. A second run is refused at once, naming the holder's
pid and host; the kernel releases the lock when its holder dies, even by kill -9, so a
crashed run never needs a manual unlock. On shared storage (NFS) flock is seen by every
machine; where the file system offers no locks at all, the run goes on with a note.

A save_dir equal to the data dir, or inside it, is refused: config.yaml would overwrite
the data dir's own, and `nmt-preprocess overwrite=true` replacing the data dir would take
the checkpoints with it. The other way round (a data dir inside the run dir, as
scripts/demo.sh makes) is fine: nmt-train writes and deletes only its own file names.
"""

from __future__ import annotations

import errno
import os
from contextlib import ExitStack
from pathlib import Path

from nmt import distributed
from nmt.distributed import DistEnv
from nmt.errors import NmtError, setting
from nmt.fsutil import exclusive_lock
from nmt.training.config import TrainConfig

LOCK_FILE = ".nmt-train.lock"
# flock errors of file systems that offer no locks (e.g. Lustre mounted without -o flock)
_NO_LOCKS = (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP)


def check_place(cfg: TrainConfig) -> None:
    """NmtError when save_dir is the data dir or inside it (symlinks and `..` resolved)."""
    save_dir, data = Path(os.path.realpath(cfg.run_dir())), Path(os.path.realpath(cfg.data_dir()))
    if save_dir == data or save_dir.is_relative_to(data):
        where = "is the data dir" if save_dir == data else f"is inside the data dir {data}"
        raise NmtError(
            f"{setting('save_dir', cfg.save_dir)}: {where} (data={cfg.data}); its checkpoints "
            "would be lost when the data dir is rebuilt: choose a save_dir outside it"
        )


def lock_run_dir(cfg: TrainConfig, env: DistEnv) -> tuple[ExitStack, list[str]]:
    """Rank 0 takes save_dir's lock; returns what holds it (close it at the end of the run)
    and notes for the log. A collective: when rank 0 is refused, every rank raises the
    refusal, so that a torchrun job stops as one."""
    stack = ExitStack()
    refusal: str | None = None
    notes: list[str] = []
    if env.is_main:
        try:
            notes = _lock(stack, Path(cfg.run_dir()), setting("save_dir", cfg.save_dir))
        except NmtError as exc:
            refusal = str(exc)
    if env.is_distributed:  # every rank learns rank 0's answer
        refusal = distributed.all_gather_objects(refusal)[0]
    if refusal is not None:
        stack.close()
        raise NmtError(refusal)
    return stack, notes


def _lock(stack: ExitStack, save_dir: Path, what: str) -> list[str]:
    """Create save_dir (removed again if the run fails to start and leaves nothing in it)
    and enter its lock into `stack`."""
    created = not save_dir.exists()
    try:
        save_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise NmtError(
            f"{what}: cannot create it ({exc.strerror or exc}); choose a writable path"
        ) from exc
    lock = save_dir / LOCK_FILE
    if created:
        stack.callback(_remove_if_unused, save_dir, lock)
    try:
        stack.enter_context(exclusive_lock(lock, what))
    except OSError as exc:
        if exc.errno not in _NO_LOCKS:
            stack.close()
            raise NmtError(
                f"{lock}: cannot lock it ({exc.strerror or exc}); check save_dir"
            ) from exc
        return [
            f"{what}: its file system offers no locks ({exc.strerror}); nothing stops a "
            "second nmt-train on this save_dir, so start only one"
        ]
    except NmtError:
        stack.close()
        raise
    return []


def _remove_if_unused(save_dir: Path, lock: Path) -> None:
    """Undo the save_dir this run created, when the run wrote nothing into it."""
    try:
        if {p.name for p in save_dir.iterdir()} <= {LOCK_FILE}:
            lock.unlink(missing_ok=True)
            save_dir.rmdir()
    except OSError:
        pass  # another process put something there: it stays
