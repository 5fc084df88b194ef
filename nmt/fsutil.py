"""The one way nmt writes files and directories (docs/ARCHITECTURE.md, "Durability").

The rule: a file or directory appears under its final name only when it is complete and
on disk. It is written under a temporary name in the same directory
(`.<name>.<random>.tmp`), flushed and fsynced, renamed over the final name, and the
directory holding it is fsynced. A crash or kill at any moment leaves the old version or
the new one, never a mix of both; the temporary a killed writer leaves behind carries the
`.tmp` suffix and is removed by the next run of the command that wrote it
(`remove_stale_temps`). New files get the permissions the umask allows (0666 & ~umask,
0777 & ~umask for directories), as `open()` would give them.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import fnmatch
import glob
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from nmt.errors import NmtError
from nmt.processes import interrupts_deferred

TMP_SUFFIX = ".tmp"


def umask() -> int:
    """The process's umask (reading it means setting it; set it straight back)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def fsync_dir(path: str | os.PathLike) -> None:
    """Flush a directory entry, so that a rename into it survives a power cut."""
    dir_fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _temp_name(path: Path) -> str:
    return f".{path.name}."


@contextmanager
def atomic_write(
    path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8"
) -> Iterator[IO[Any]]:
    """Open a temporary sibling of `path` for writing; on a clean exit it becomes `path`.

    `mode` is "w" (text, `encoding`) or "wb". On an exception the temporary is removed and
    `path` is untouched. The parent directory must exist.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_write: mode {mode!r}; use 'w' or 'wb'")
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=_temp_name(target), suffix=TMP_SUFFIX, dir=target.parent)
    try:
        # Held while writing, released by the kernel when the writer ends or dies: the
        # mark by which remove_stale_temps tells a live writer's temporary from a stale one.
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.fchmod(fd, 0o666 & ~umask())  # mkstemp makes it private; the umask decides
        with os.fdopen(fd, mode, encoding=None if "b" in mode else encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
        fsync_dir(target.parent)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_write(path, "wb") as f:
        f.write(data)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_write(path, "w") as f:
        f.write(text)


def atomic_copy(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Make `dst` an independent copy of the file `src`, put in place as `atomic_write` does.

    Never a hard link or a symlink: writing one name in place (`cp a.pt b.pt`) must not
    change another. The bytes move inside the kernel (copy_file_range: no trip through
    Python, and a reflink on file systems that share extents, e.g. btrfs or XFS), or by
    shutil's copy where the file system does not offer it.
    """
    with open(src, "rb") as source, atomic_write(dst, "wb") as target:
        target.flush()  # nothing is buffered yet; the copy below writes to the descriptor
        if not _copy_in_kernel(source.fileno(), target.fileno()):
            source.seek(0)
            target.seek(0)
            target.truncate()
            shutil.copyfileobj(source, target, 1 << 20)


# copy_file_range's errors where the kernel or the file system cannot do it for this pair
_NO_COPY_RANGE = (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL)


def _copy_in_kernel(src_fd: int, dst_fd: int) -> bool:
    """Copy all of `src_fd` to `dst_fd` with copy_file_range; False where it is unsupported
    (another kernel, a cross-device pair, a file system without it), before any byte."""
    left = os.fstat(src_fd).st_size
    copied = 0
    while left > 0:
        try:
            n = os.copy_file_range(src_fd, dst_fd, min(left, 1 << 30))
        except OSError as exc:
            if copied == 0 and exc.errno in _NO_COPY_RANGE:
                return False
            raise
        if n == 0:  # the source shrank under us: copy what is there
            break
        left -= n
        copied += n
    return True


def fsync_tree(root: Path) -> None:
    """fsync every file and directory under `root` (deepest first), and `root` itself."""
    for dirpath, _, filenames in os.walk(root, topdown=False):
        for name in filenames:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(dirpath)


@contextmanager
def atomic_directory(path: str | os.PathLike) -> Iterator[Path]:
    """Build a directory in a temporary sibling of `path`; on a clean exit it replaces `path`.

    Yields the temporary directory to fill. On success its contents are fsynced, then it
    takes the place of `path` in one atomic exchange where the kernel offers one (Linux's
    renameat2), else by moving any old `path` aside and renaming the new one into place;
    the parent is fsynced, and only then the old one deleted. At every moment `path` is the
    old directory or the complete new one (with the fallback, a kill -9 between its two
    renames leaves the old one aside under a temporary name), and Ctrl-C or SIGTERM never
    cut the swap in two. On an exception the temporary directory is removed. Whether an
    existing `path` may be replaced is the caller's decision, made before.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=_temp_name(target), suffix=TMP_SUFFIX, dir=target.parent))
    try:
        os.chmod(tmp, 0o777 & ~umask())  # mkdtemp makes it private; the umask decides
        yield tmp
        fsync_tree(tmp)
        old = None
        try:
            with interrupts_deferred():
                old = _swap_into_place(tmp, target)
                fsync_dir(target.parent)
        finally:  # the new one is in place: the old one goes, even if a signal was held
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2  # linux/fs.h


def exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths in one step (renameat2 RENAME_EXCHANGE); False where the
    C library, kernel or file system cannot."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    done = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if done == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _swap_into_place(new: Path, target: Path) -> Path | None:
    """Put the directory `new` at `target`; returns where the old `target` now is, if any."""
    if not target.exists():
        os.rename(new, target)
        return None
    if exchange(new, target):
        return new  # the old directory now has the temporary's name
    old = target.parent / f".{target.name}.old-{os.getpid()}{TMP_SUFFIX}"
    os.rename(target, old)
    try:
        os.rename(new, target)
    except BaseException:
        os.rename(old, target)  # put the old one back
        raise
    return old


def stale_temps(path: str | os.PathLike) -> list[Path]:
    """Temporaries that an interrupted write of `path` (file or directory) left beside it."""
    target = Path(path)
    if not target.parent.is_dir():
        return []
    pattern = f"{glob.escape(_temp_name(target))}*{TMP_SUFFIX}"
    return sorted(target.parent.glob(pattern))


def remove_stale_temps(path: str | os.PathLike) -> list[Path]:
    """Delete what `stale_temps(path)` finds; returns the paths removed.

    A temporary file that a live `atomic_write` holds (its flock) is left alone, so two
    runs writing the same file never delete each other's work. Directories carry no such
    mark: call it for a directory only where no other process can be building `path` at
    the same time (the caller holds the lock of the directory, or is the one writer by
    construction).
    """
    removed = [stale for stale in stale_temps(path) if not _being_written(stale)]
    for stale in removed:
        if stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            stale.unlink(missing_ok=True)
    return removed


def _being_written(temp: Path) -> bool:
    """Whether a live atomic_write holds `temp` (a file): its flock is taken."""
    if temp.is_dir() or temp.is_symlink():
        return False
    try:
        fd = os.open(temp, os.O_RDONLY)
    except FileNotFoundError:  # renamed into place meanwhile: not stale either
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


@contextmanager
def exclusive_lock(
    lock_path: str | os.PathLike, what: str, *, remove: bool = False
) -> Iterator[None]:
    """Hold an exclusive `flock` on `lock_path` for the block, or refuse at once.

    `what` names the locked thing in the refusal ("save_dir=runs/x"). The lock itself lives
    in the kernel, so a holder that dies, even by kill -9, releases it, and no run ever needs
    a manual unlock. The file records the holder's pid and host, which the refusal names.
    The lock file stays after the block unless `remove`: then the holder unlinks it before
    releasing, and every taker checks, once it holds the lock, that the path still names
    the file it locked (else it locked an unlinked file and tries again), so removal never
    lets two holders in.
    """
    path = Path(lock_path)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "unknown"
            os.close(fd)
            raise NmtError(
                f"{what}: in use by another process ({holder}, lock {path}); wait for it to "
                "finish or stop it, or choose another path"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            current = os.stat(path)
        except FileNotFoundError:
            current = None
        if current is not None and os.path.samestat(current, os.fstat(fd)):
            break
        os.close(fd)  # the holder before us removed this file: lock the one there now
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on host {socket.gethostname()}\n".encode(), 0)
        yield
    finally:
        if remove:
            path.unlink(missing_ok=True)  # while still holding the lock (see above)
        os.close(fd)  # closing the last descriptor releases the flock


def check_not_an_input(key: str, output: str | os.PathLike, inputs: list[tuple[str, str]]) -> None:
    """NmtError when the file `key`=`output` would overwrite one of `inputs` ((key, path)
    pairs; "-" is stdin): the same file under any name (symlinks, hard links, `..`), so
    compared with os.path.samefile. An output whose folders are still to be made
    (`new/../x`) is compared as it will be written, its `..` taken lexically."""
    target = Path(output)
    if not target.exists():
        target = Path(os.path.abspath(output))
        if not target.exists():  # a new file cannot be an existing input
            return
    for name, path in inputs:
        if path != "-" and Path(path).exists() and target.samefile(path):
            raise NmtError(
                f"{key}={output}: is an input of this run ({name}={path}); choose another file"
            )


@contextmanager
def destination_lock(path: str | os.PathLike, what: str) -> Iterator[None]:
    """The lock of a file or directory that is built beside itself and renamed into place:
    `.<name>.lock` in its parent, removed when released. Parent folders it had to create
    are removed again if the block leaves them empty (a run that failed writes nothing)."""
    target = Path(path).absolute()
    created = [p for p in target.parents if not p.exists()]  # deepest first
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        with exclusive_lock(target.parent / f".{target.name}.lock", what, remove=True):
            yield
    finally:
        for folder in created:
            try:
                folder.rmdir()
            except OSError:  # not empty: the output is in it, or someone else's files
                break


def describe_contents(path: Path, limit: int = 10_000) -> str:
    """'12 files', '3 files and 2 folders', 'over 10000 entries': what a directory holds."""
    files = folders = 0
    for _, dirnames, filenames in os.walk(path):
        files += len(filenames)
        folders += len(dirnames)
        if files + folders > limit:
            return f"over {limit} entries"
    text = f"{files} file{'s' if files != 1 else ''}"
    if folders:
        text += f" and {folders} folder{'s' if folders != 1 else ''}"
    return text


@dataclass(frozen=True)
class OutputKind:
    """What one command writes as a directory: how to recognize it, and its own files."""

    name: str  # "nmt data dir", "nmt-export directory"
    marker: str  # the file that only this command writes there (meta.json, nmt_export.json)
    own: tuple[str, ...]  # glob patterns of every file the command writes there

    def foreign(self, path: Path) -> list[str]:
        """Entries of `path` (recursively) that this command did not write, sorted."""
        found = []
        for entry in sorted(path.rglob("*")):
            rel = entry.relative_to(path)
            if entry.is_dir() and not entry.is_symlink():
                continue
            if len(rel.parts) > 1 or not any(fnmatch.fnmatchcase(rel.name, p) for p in self.own):
                found.append(str(rel))
        return found


def check_replaceable(path: Path, key: str, kind: OutputKind, overwrite: bool) -> None:
    """NmtError unless a directory of `kind` may be written at `path` (given by option `key`).

    Allowed: nothing there, an empty directory, or with `overwrite` a directory of `kind`
    holding nothing but its own files. Never replaced, even with overwrite: a file, a
    symbolic link, or a directory without `kind.marker` (a run dir full of checkpoints) or
    with anything else in it; the refusal says what is there.
    """
    given = f"{key}={path}"
    if path.is_symlink():
        raise NmtError(f"{given}: is a symbolic link; give the directory it points to")
    if not path.exists():
        return
    if not path.is_dir():
        raise NmtError(f"{given}: exists and is not a directory; choose another {key}")
    if not any(path.iterdir()):
        return
    if not (path / kind.marker).is_file():
        raise NmtError(
            f"{given}: holds {describe_contents(path)} and is not an {kind.name} (no "
            f"{kind.marker}); choose another {key} (overwrite=true only replaces an {kind.name})"
        )
    if not overwrite:
        raise NmtError(
            f"{given}: an {kind.name} already exists there; choose another path or set "
            "overwrite=true to replace it"
        )
    foreign = kind.foreign(path)
    if foreign:
        shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        raise NmtError(
            f"{given}: an {kind.name} that also holds {len(foreign)} other "
            f"entr{'ies' if len(foreign) > 1 else 'y'} ({shown}), which overwrite=true would "
            f"delete; move {'them' if len(foreign) > 1 else 'it'} out or choose another {key}"
        )


def check_text_output(path: Path, key: str, command: str) -> None:
    """NmtError if a text output at `path` would replace a file that is not text.

    Commands that write text (translations, score reports) replace an earlier output of
    theirs, as `>` would; a binary file there (a checkpoint, a data dir's arrays, a
    SentencePiece model) is someone's work that a typo must not destroy. Binary means: a
    NUL byte in the first 8 KiB (checkpoints, arrays, models and compressed files all have
    one; text does not).
    """
    if not path.is_file():
        return
    with open(path, "rb") as f:
        head = f.read(8192)
    if b"\0" in head:
        raise NmtError(
            f"{key}={path}: exists and holds binary data (a checkpoint or model?), not text; "
            f"{command} writes text and replaces only text files: choose another {key}"
        )
