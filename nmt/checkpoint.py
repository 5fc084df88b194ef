"""Checkpoint files: the format (build_checkpoint), atomic writes with a checksum, safe reads.

A checkpoint is a plain dict of tensors and containers (see docs/ARCHITECTURE.md), read
with `torch.load(weights_only=True)` so that a checkpoint from someone else cannot run
code. The tokenizer(s) travel inside, so generation needs nothing but the file. This module
knows the file, not the model: building a model and tokenizers from it for inference is
nmt.generation.loading's job.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
from pathlib import Path
from typing import IO, Any, cast

import torch

from nmt.errors import NmtError
from nmt.fsutil import atomic_write

FORMAT_VERSION = 1
CHECKSUM_KEY = "checksum"  # "sha256:<hex>" of every other entry, see payload_checksum


def _feed(h: hashlib._Hash, obj: Any) -> None:
    """Hash `obj` canonically: tensors by dtype, shape and bytes; containers in order."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous().reshape(-1)
        h.update(f"T{t.dtype}{tuple(obj.shape)};".encode())
        h.update(t.view(torch.uint8).numpy().tobytes())  # raw bytes of any dtype (bf16 too)
    elif isinstance(obj, dict):
        h.update(f"D{len(obj)};".encode())
        for key, value in obj.items():  # pickle keeps insertion order, so this is stable
            _feed(h, key)
            _feed(h, value)
    elif isinstance(obj, (list, tuple)):
        h.update(f"L{len(obj)};".encode())
        for value in obj:
            _feed(h, value)
    else:  # str, int, float (repr round-trips exactly), bool, None, torch.dtype, ...
        h.update(f"{type(obj).__name__}:{obj!r};".encode())


def payload_checksum(obj: dict[str, Any]) -> str:
    """sha256 over every entry but the checksum itself: catches bit flips torch.load misses."""
    h = hashlib.sha256()
    _feed(h, {k: v for k, v in obj.items() if k != CHECKSUM_KEY})
    return "sha256:" + h.hexdigest()


def save_checkpoint(obj: dict[str, Any], path: str | os.PathLike) -> None:
    """Write `obj` to `path` atomically (nmt.fsutil.atomic_write), with its checksum.

    A crash or kill at any moment leaves either the old file or the new one, never a
    partial one. A full disk raises NmtError and leaves the previous file intact.
    """
    path = Path(path)
    obj = {**obj, CHECKSUM_KEY: payload_checksum(obj)}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise NmtError(
            f"{path.parent}: cannot create the checkpoint directory "
            f"({exc.strerror or exc}); choose a writable path"
        ) from exc
    opened = False
    try:
        with atomic_write(path, "wb") as f:
            opened = True
            writer = _WriteErrors(f)
            try:
                torch.save(obj, cast(IO[bytes], writer))
            except RuntimeError:
                # torch's zip writer swallows the file's OSError and reports only a size
                # mismatch ("enforce fail at inline_container.cc"): raise the real cause
                if writer.error is not None:
                    raise writer.error from None
                raise
    except OSError as exc:
        if not opened:  # the temporary file could not even be created
            raise NmtError(
                f"{path}: cannot write the checkpoint ({exc.strerror or exc}); choose a "
                "writable save_dir"
            ) from exc
        raise NmtError(
            f"{path}: could not write checkpoint ({exc.strerror or exc}); the previous "
            f"checkpoint is intact: {write_failure_hint(exc)}"
        ) from exc


def write_failure_hint(exc: OSError) -> str:
    """What to do after writing a checkpoint failed with `exc` (the end of a message)."""
    fix = {
        errno.ENOSPC: "free space on its device",
        errno.EDQUOT: "free space within your disk quota",
        errno.EFBIG: "raise the file size limit (ulimit -f) or write elsewhere",
    }.get(exc.errno or 0, "fix that")
    return f"{fix} and run the command again"


class _WriteErrors:
    """A binary file's write(), remembering the OSError it raised (see save_checkpoint)."""

    def __init__(self, f: IO[bytes]) -> None:
        self._f = f
        self.error: OSError | None = None

    def write(self, data: bytes) -> int:
        try:
            return self._f.write(data)
        except OSError as exc:
            self.error = exc
            raise

    def flush(self) -> None:
        self._f.flush()


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict:
    """Read a checkpoint safely; every failure is an NmtError naming the file."""
    path = Path(path)
    if path.is_dir():
        raise NmtError(
            f"{path}: a directory, not a checkpoint; name a file in it (e.g. "
            f"{path / 'checkpoint_best.pt'})"
        )
    if not path.is_file():
        raise NmtError(f"{path}: checkpoint not found")
    try:
        obj = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:
        raise NmtError(
            f"{path}: not a readable nmt checkpoint: {_unreadable(path, exc)}; use a "
            "checkpoint nmt-train wrote (e.g. a numbered checkpoint_<epoch>_<update>.pt)"
        ) from exc
    if not isinstance(obj, dict) or "model" not in obj or "model_config" not in obj:
        raise NmtError(f"{path}: not an nmt checkpoint (no model or model_config inside)")
    version = obj.get("format_version")
    if version != FORMAT_VERSION:
        raise NmtError(
            f"{path}: checkpoint format_version {version!r}; this nmt reads "
            f"version {FORMAT_VERSION}"
        )
    stored = obj.pop(CHECKSUM_KEY, None)  # absent from files written before checksums
    if stored is not None and stored != payload_checksum(obj):
        raise NmtError(
            f"{path}: checksum mismatch, the file is corrupted; use another "
            "checkpoint (e.g. a numbered checkpoint_<epoch>_<update>.pt)"
        )
    return obj


_ZIP_MAGIC = b"PK\x03\x04"  # torch.save's format: a zip archive
_PICKLE_MAGIC = b"\x80"  # torch's legacy format: a pickle (protocol 2 or later)


def _unreadable(path: Path, exc: Exception) -> str:
    """Why torch.load could not read `path`, in words that fit one line: torch's own
    messages run over several sentences, and a text file gives a bare KeyError."""
    with open(path, "rb") as f:
        head = f.read(512)
    if not head:
        return "the file is empty (truncated or corrupted)"
    if not head.startswith((_ZIP_MAGIC, _PICKLE_MAGIC)):
        try:
            head.decode("utf-8")
        except UnicodeDecodeError as bad:
            if bad.start < len(head) - 4:  # not just a character cut at the 512th byte
                return "not a torch file (unknown format)"
        return "a text file, not a torch file"
    text = " ".join(str(exc).split())
    refused = re.search(r"Unsupported global: GLOBAL ([\w.]+)", text)
    if refused:  # weights_only: the pickle names code to run
        return (
            f"it holds an object of type {refused.group(1)}, which checkpoints never "
            "contain and nmt does not load (it could run code)"
        )
    first = re.split(r"(?<=[.!?])\s", text, maxsplit=1)[0].rstrip(".") if text else ""
    return f"truncated or corrupted ({first or type(exc).__name__})"


def _describe_existing(path: Path) -> tuple[str, dict[str, Any] | None]:
    """What the file at `path` is, and its `config` entry when it is an nmt checkpoint; the
    tensors stay on disk (memory-mapped), so this costs little for any size."""
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:
        return "not an nmt checkpoint", None
    if not isinstance(obj, dict) or "model" not in obj or "model_config" not in obj:
        return "not an nmt checkpoint", None
    config = obj["config"] if isinstance(obj.get("config"), dict) else {}
    if "train_state" in obj:
        return "a training checkpoint (it holds train_state)", config
    if "averaged_from" in config:
        return "a checkpoint written by nmt-average", config
    if "imported_from" in config:
        return "a checkpoint written by nmt-import-fairseq", config
    return "an nmt checkpoint", config


def check_checkpoint_output(
    path: str | os.PathLike, key: str, command: str, mark: str, overwrite: bool
) -> None:
    """NmtError unless `command` may write a checkpoint at `path` (given by option `key`).

    Allowed: nothing there, or (with `overwrite`) a checkpoint that `command` wrote before,
    recognized by `mark` in its `config` entry (nmt-average: averaged_from; nmt-import-fairseq:
    imported_from). Never replaced: a directory, a training checkpoint, any other file.
    """
    path = Path(path)
    given = f"{key}={path}"
    if path.is_dir():
        raise NmtError(f"{given}: is a directory; give a file name for the checkpoint")
    if not path.exists():
        return
    what, config = _describe_existing(path)
    if config is None or mark not in config:
        raise NmtError(
            f"{given}: exists and is {what}, not one {command} wrote; choose another {key} "
            f"({command} replaces only its own earlier output)"
        )
    if not overwrite:
        raise NmtError(
            f"{given}: already exists; choose another path or set overwrite=true to replace it"
        )


def tokenizer_to_tensor(model_bytes: bytes) -> torch.Tensor:
    """SentencePiece model bytes as a uint8 tensor (weights_only-loadable)."""
    return torch.frombuffer(bytearray(model_bytes), dtype=torch.uint8).clone()


def tensor_to_bytes(t: torch.Tensor) -> bytes:
    return bytes(t.cpu().numpy().tobytes())


def build_checkpoint(
    *,
    model_state: dict[str, torch.Tensor],
    model_config: dict[str, Any],
    data: dict[str, Any],
    src_tokenizer: bytes,
    tgt_tokenizer: bytes,
    train_state: dict[str, Any] | None = None,
    config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A checkpoint dict in the documented layout; the inference part is always complete.

    `train_state` is left out of averaged or imported checkpoints (generation ignores it).
    """
    ckpt: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "model_config": dict(model_config),
        "model": model_state,
        "data": dict(data),
        "tokenizers": {
            "src": tokenizer_to_tensor(src_tokenizer),
            "tgt": tokenizer_to_tensor(tgt_tokenizer),
        },
    }
    if train_state is not None:
        ckpt["train_state"] = train_state
    if config is not None:
        ckpt["config"] = config
    return ckpt
