"""nmt-generate workers=N: chunks of the input translated by N worker processes.

The parent reads and encodes the input (its warnings and checks stay where workers=1
has them), hands each chunk of `buffer_size` consecutive lines to an idle worker, keeps
each finished chunk in the run's work folder (nmt.generation.workfolder) as soon as it
arrives, and yields the outputs in input order; at most 2 chunks per worker are read
ahead and unwritten, so memory stays bounded on any input. Each worker is a spawned
process (a fresh interpreter: no forked torch thread pools) that loads the model once
and translates with its own CPU threads.

A worker gets one chunk at a time over its own pipe, so a worker that dies (killed, out
of memory) is known with its chunk: a one-line error names it, and the chunks finished
before stay in the work folder for the next run. Workers die with the parent, even one
killed by kill -9 (nmt.processes.become_child_of).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

from nmt.errors import NmtError, option_error
from nmt.generation.chunks import ChunkOutput, ChunkTranslator, load_translator
from nmt.generation.config import GenerateConfig
from nmt.generation.io import Source, library_warnings_printed, print_note
from nmt.generation.terminology import Glossary
from nmt.generation.workfolder import WorkFolder
from nmt.processes import become_child_of, interrupts_deferred

STOP_WAIT_S = 30.0  # a worker told to stop after the last chunk exits at once


def worker_threads(cfg: GenerateConfig) -> int:
    """Each worker's torch threads: threads= when given, else the process's cores shared
    out (at least 1), so that workers x threads does not oversubscribe the CPU."""
    if cfg.threads:
        return cfg.threads
    return max(1, len(os.sched_getaffinity(0)) // cfg.workers)


def check_workers(cfg: GenerateConfig) -> None:
    """workers=N needs CPU translation in one process tree (NmtError otherwise)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise option_error(
            "workers",
            cfg.workers,
            "not supported under torchrun (ranks do not split the chunks yet)",
            "run workers=1, or one nmt-generate per GPU on its own part of the input",
        )
    if cfg.interactive:
        raise option_error(
            "workers",
            cfg.workers,
            "interactive=true translates each line as it is read",
            "drop workers= (or interactive=true)",
        )
    if cfg.device == "cpu":
        return
    import torch

    if cfg.device != "auto" or torch.cuda.is_available():
        raise option_error(
            "workers",
            cfg.workers,
            f"worker processes translate on the CPU, not device={cfg.device}",
            "add device=cpu, or use workers=1 on a GPU",
        )


@dataclass
class _Worker:
    process: BaseProcess
    conn: Connection
    task: int | None = None  # the chunk (sequence number) it translates, if any


@dataclass
class _Pending:
    chunk: list[Source]
    out: ChunkOutput | None = None


class WorkerPool:
    """cfg.workers spawned translating processes; use as a context."""

    def __init__(self, cfg: GenerateConfig, threads: int):
        self.cfg = cfg
        self.threads = threads
        self.workers: list[_Worker] = []
        self.folder: WorkFolder | None = None

    def __enter__(self) -> WorkerPool:
        context = multiprocessing.get_context("spawn")
        with interrupts_deferred():  # a signal mid-start must not leave a worker unnoticed
            for number in range(1, self.cfg.workers + 1):
                conn, child_conn = context.Pipe()
                process = context.Process(
                    target=serve,
                    args=(child_conn, self.cfg, self.threads, os.getpid()),
                    name=f"nmt-generate worker {number}",
                    daemon=True,
                )
                process.start()
                child_conn.close()
                self.workers.append(_Worker(process, conn))
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        for worker in self.workers:
            if exc_type is None:  # every chunk is done: let it exit on its own
                self._send(worker, None)
                worker.process.join(STOP_WAIT_S)
            if worker.process.is_alive():
                worker.process.kill()
            worker.process.join()
            worker.conn.close()
        self.workers = []

    def outputs(
        self, chunks: Iterator[list[Source]], folder: WorkFolder | None
    ) -> Iterator[tuple[list[Source], ChunkOutput]]:
        """Each chunk with its output, in input order: taken from `folder` when it holds
        it finished, else translated by a worker (and kept in `folder` once done)."""
        self.folder = folder
        if folder is not None and (reused := folder.finished()):
            print_note(
                f"resuming from {folder.path}: {reused} finished chunk(s) reused, the rest "
                "translated (resume=false starts over)"
            )
        ahead: dict[int, _Pending] = {}  # read, not yet written, by sequence number
        waiting: deque[int] = deque()  # read, to be given to a worker
        numbered = enumerate(chunks)
        next_out, exhausted = 0, False
        while True:
            while not exhausted and len(ahead) < 2 * len(self.workers):
                item = next(numbered, None)
                if item is None:
                    exhausted = True
                    break
                number, chunk = item
                done = folder.load(chunk[0].index, len(chunk)) if folder else None
                ahead[number] = _Pending(chunk, done)
                if done is None:
                    waiting.append(number)
            for worker in self.workers:
                if worker.task is None and waiting:
                    number = waiting.popleft()
                    worker.task = number
                    self._send(worker, (number, ahead[number].chunk))
            while next_out in ahead and ahead[next_out].out is not None:
                pending = ahead.pop(next_out)
                assert pending.out is not None
                yield pending.chunk, pending.out
                next_out += 1
            if exhausted and not ahead:
                return
            if any(w.task is not None for w in self.workers):
                self._receive(ahead)

    @staticmethod
    def _send(worker: _Worker, message: Any) -> None:
        try:
            worker.conn.send(message)
        except OSError:  # it died: _receive finds out and says which chunk
            pass

    def _receive(self, ahead: dict[int, _Pending]) -> None:
        """Wait until a busy worker has finished its chunk (kept in the work folder at
        once) or died (NmtError naming the chunk)."""
        busy = [w for w in self.workers if w.task is not None]
        ready = wait([w.conn for w in busy] + [w.process.sentinel for w in busy])
        for worker in busy:
            if worker.conn not in ready and worker.process.sentinel not in ready:
                continue
            assert worker.task is not None
            message = None
            try:
                if worker.conn.poll():
                    message = worker.conn.recv()
            except (EOFError, OSError):
                pass
            if message is None:
                raise self._died(worker, ahead[worker.task].chunk)
            number, out, error = message
            if error is not None:
                raise NmtError(error)
            if self.folder is not None:
                self.folder.save(out)
            ahead[number].out = out
            worker.task = None

    def _died(self, worker: _Worker, chunk: list[Source]) -> NmtError:
        worker.process.join(5)
        code = worker.process.exitcode
        how = (
            f"killed by {signal.Signals(-code).name}"
            if code is not None and code < 0
            else f"exit code {code}"
        )
        lines = f"lines {chunk[0].index + 1}-{chunk[-1].index + 1}"
        kept = "run again (fewer workers or a smaller buffer_size need less memory)"
        if self.folder is not None:
            kept = (
                f"the {self.folder.finished()} finished chunk(s) are kept in "
                f"{self.folder.path}: run the same command again to resume"
            )
        return NmtError(
            f"{worker.process.name} died ({how}; out of memory?) while translating the "
            f"chunk of {lines}; {kept}"
        )


def serve(conn: Connection, cfg: GenerateConfig, threads: int, parent_pid: int) -> None:
    """A worker's life: load the model once, then translate the chunks it is sent until
    it is sent None (or the parent is gone). Errors go back as one-line messages."""
    become_child_of(parent_pid)
    number = None
    try:
        with library_warnings_printed():
            translator = load_translator(cfg, threads)
            glossary = Glossary.read(cfg.glossary) if cfg.glossary is not None else None
            translate = ChunkTranslator(cfg, translator, glossary)
            while (task := conn.recv()) is not None:
                number, chunk = task
                conn.send((number, translate(chunk), None))
    except (EOFError, BrokenPipeError):  # the parent is gone
        return
    except NmtError as exc:
        conn.send((number, None, str(exc)))
    except Exception as exc:  # a bug: still one line in the parent
        conn.send((number, None, f"{type(exc).__name__} in a worker process: {exc}"))
