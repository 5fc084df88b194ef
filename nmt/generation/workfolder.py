"""The work folder of a resumable nmt-generate run: `<output>.parts/` beside the output.

A run with workers keeps each finished chunk there as one file, written atomically
(nmt.fsutil), so that the same command run again after a crash or kill -9 translates
only the chunks that are missing. Its manifest records what decides the output: every
option that changes it, and the identity (resolved path, size, modification time) of
the checkpoint(s) and of every input file. A folder left by a run that differs in any
of them is never mixed in: it is an error naming what differs, and resume=false starts
over. The folder goes once the output is complete.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from nmt.errors import NmtError, setting
from nmt.fsutil import atomic_write_text
from nmt.generation.chunks import ChunkOutput
from nmt.generation.config import GenerateConfig
from nmt.generation.io import is_data_file
from nmt.generation.translator import checkpoint_paths
from nmt.textlines import STDIN

MANIFEST = "manifest.json"
FORMAT = 1
# Options that change how a run goes, never its output.
RUN_ONLY = ("workers", "threads", "resume", "progress", "debug", "output", "interactive")
# Options naming files whose contents decide the output (besides checkpoint=).
FILE_OPTIONS = (
    "input",
    "ref",
    "prefix_file",
    "constraints",
    "glossary",
    "shortlist",
    "tgt_lang_file",
)


def work_folder_path(output: str) -> Path:
    return Path(f"{output}.parts")


def resumable(cfg: GenerateConfig) -> bool:
    """Whether a run keeps its finished chunks: an output file and an input file or
    data dir (stdin cannot be read again, stdout cannot be taken back)."""
    return cfg.output != STDIN and cfg.input != STDIN


class WorkFolder:
    """Finished chunks of one run's output, by their first line."""

    def __init__(self, cfg: GenerateConfig):
        self.output = cfg.output
        self.path = work_folder_path(cfg.output)
        self.manifest = manifest(cfg)
        self._made = False

    @classmethod
    def for_run(cls, cfg: GenerateConfig) -> WorkFolder | None:
        """The run's work folder (None when it cannot resume), checked against a folder
        left by an earlier run: resume=true takes up its chunks (with a note saying how
        many), or refuses one of another run; resume=false removes it."""
        if not resumable(cfg):
            return None
        folder = cls(cfg)
        if folder.path.exists() and not cfg.resume:
            shutil.rmtree(folder.path)
        elif folder.path.exists():
            folder.check_same_run()
            folder._made = True
        return folder

    def check_same_run(self) -> None:
        where = f"{setting('output', self.output)}: its work folder {self.path}"
        try:
            left = json.loads((self.path / MANIFEST).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise NmtError(
                f"{where} has no readable {MANIFEST} (not a folder of nmt-generate's?); "
                "move it away, or add resume=false to start over"
            ) from None
        if left.get("format") != FORMAT:
            raise NmtError(f"{where} is of another nmt version; add resume=false to start over")
        for key, value in self.manifest["options"].items():
            if left["options"].get(key, value) != value:
                raise NmtError(
                    f"{where} holds chunks translated with "
                    f"{setting(key, left['options'][key])}, not {setting(key, value)}; run "
                    "with the same options to resume it, or add resume=false to start over"
                )
        for key, identity in self.manifest["files"].items():
            if left["files"].get(key) != identity:
                raise NmtError(
                    f"{where} holds chunks of another {key}= (a file named there changed "
                    "since: its size or time differs); add resume=false to start over"
                )

    def finished(self) -> int:
        """How many finished chunks the folder holds."""
        return len(list(self.path.glob("chunk-*.json"))) if self.path.is_dir() else 0

    def _chunk_path(self, first: int) -> Path:
        return self.path / f"chunk-{first:012d}.json"

    def load(self, first: int, lines: int) -> ChunkOutput | None:
        """The finished chunk of `lines` lines from 0-based line `first`, or None."""
        path = self._chunk_path(first)
        if not path.is_file():
            return None
        try:
            out = ChunkOutput(**json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError):
            out = None
        if out is None or out.lines != lines or out.first != first:
            raise NmtError(
                f"{path}: not a finished chunk of lines {first + 1}-{first + lines}; "
                "add resume=false to start over"
            )
        return out

    def save(self, out: ChunkOutput) -> None:
        if not self._made:
            self.path.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.path / MANIFEST, json.dumps(self.manifest, indent=1))
            self._made = True
        atomic_write_text(self._chunk_path(out.first), json.dumps(asdict(out)))

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def manifest(cfg: GenerateConfig) -> dict[str, Any]:
    """What decides a run's output: its options, and its files' identities."""
    options = {
        f.name: getattr(cfg, f.name)
        for f in fields(cfg)
        if f.name not in RUN_ONLY and f.name != "checkpoint"
    }
    files: dict[str, Any] = {"checkpoint": [identity(p) for p in checkpoint_paths(cfg.checkpoint)]}
    for key in FILE_OPTIONS:
        if (path := getattr(cfg, key)) is not None and path != STDIN:
            files[key] = identity(path)
    return {"format": FORMAT, "options": options, "files": files}


def identity(path: str) -> Any:
    """A file's (or a data dir's files') resolved path, size and modification time."""
    p = Path(path).resolve()
    if p.is_dir():
        return {f.name: identity(str(f)) for f in sorted(p.iterdir()) if is_data_file(f)}
    stat = os.stat(p)
    return [str(p), stat.st_size, stat.st_mtime_ns]
