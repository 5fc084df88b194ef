"""Small file-system helpers for writes that must survive a crash."""

from __future__ import annotations

import os


def fsync_dir(path: str | os.PathLike) -> None:
    """Flush a directory entry, so that a rename into it survives a power cut."""
    dir_fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
