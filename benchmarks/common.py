"""The benchmarks' one shared helper: timing, repeats, the machine, the JSON report,
Markdown tables, and paired runs (against another git revision in this process, or
against a peer command in a subprocess).

A benchmark module defines `build_parser()` and `run(args) -> figures` and ends with
`common.main(NAME, build_parser, run)`: that parses the arguments, turns a bad one into a
one-line `benchmarks.NAME: error: ...` (exit 2), times the run and, with `--json FILE`,
writes the report, the same schema for every benchmark:

    {"schema": 1, "name": "train", "command": "python -m benchmarks.train --data ...",
     "date": "2026-11-23T10:00:00Z" (UTC, at the start), "wall_seconds": 312.4,
     "machine": {"cpu", "cores", "cpu_flags", "memory_gib", "torch", "torch_threads",
                 "python", "platform", "load_average": {"start", "end"}},
     "figures": {...what the benchmark measured...}}

Paired runs exist because this machine is shared: its speed drifts by 10-20% within
minutes, more than most changes gain. Two code versions taking turns in one process see
the same drift, so their ratio holds; `interleave` runs the turns in a balanced order
and `paired_ratio` states the ratio's own noise (a bootstrap over the turns).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import dataclasses
import functools
import importlib
import importlib.util
import io
import math
import os
import platform
import re
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MULTI30K = REPO.parent / "shared" / "data" / "multi30k"
WORK = REPO / "work" / "bench"  # default place for data dirs and outputs (git-ignored)
SCHEMA = 1
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8")


class BenchError(Exception):
    """A mistake the user can fix (an argument, a missing file): printed as one line."""


# ---------------------------------------------------------------- timing


def cpu_seconds() -> float:
    """User + system CPU time of this process (all its threads) and of its children that
    have finished (a worker pool, a peer command). Other programs on the machine slow
    the wall clock down, not this: it is what the work itself costs."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def minor_faults() -> int:
    """Minor page faults of this process so far (memory touched for the first time)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


@dataclass
class Timing:
    """What one timed piece of work cost: wall and CPU seconds, minor page faults."""

    wall: float = 0.0
    cpu: float = 0.0
    faults: int = 0


@contextlib.contextmanager
def timed(sync: Callable[[], None] | None = None) -> Iterator[Timing]:
    """`with timed() as t: work()`, then t.wall, t.cpu (this process and its finished
    children), t.faults. `sync` is called before each clock is read: on a GPU
    (torch.cuda.synchronize) the work queued before the start is not counted in, and the
    work queued inside is finished before the end is read."""
    t = Timing()
    if sync is not None:
        sync()
    wall, cpu, faults = time.perf_counter(), cpu_seconds(), minor_faults()
    try:
        yield t
    finally:
        if sync is not None:
            sync()
        t.wall = time.perf_counter() - wall
        t.cpu = cpu_seconds() - cpu
        t.faults = minor_faults() - faults


# ---------------------------------------------------------------- profiles

# Operators by what they compute, for a profile's breakdown (`time_breakdown`). Matrix
# products: fp32/bf16 (MKL, oneDNN), fbgemm's and oneDNN's int8, and batched products (the
# beams' self-attention, and CPU training's attention up to nmt.model.kernels.
# MATMUL_ATTENTION_MAX_KEYS keys, two products around a softmax); attention: SDPA's kernels.
MATRIX_PRODUCTS = {
    "aten::addmm", "aten::mm", "aten::bmm", "aten::baddbmm", "aten::_mkl_linear",
    "quantized::linear_dynamic", "onednn::qlinear_pointwise", "mkldnn::_linear_pointwise",
}  # fmt: skip
ATTENTION_PREFIX = "aten::_scaled_dot_product"  # _flash_attention_for_cpu, _efficient_..., ...


def time_breakdown(
    operators: Sequence[tuple[str, float, int]], wall_seconds: float
) -> dict[str, float]:
    """Where a profiled run's time went, from the profiler's per-operator totals
    (name, self CPU seconds, calls) and the run's wall time: the seconds of matrix
    products, of attention kernels, of every other operator, and the rest of the wall
    time (Python, operator dispatch, the profiler's own cost), with the operator calls.
    Self times are spans of the calling thread, so they add up to at most the wall time
    (the rest is clamped at 0 against rounding)."""
    products = sum(t for name, t, _ in operators if name in MATRIX_PRODUCTS)
    attention = sum(t for name, t, _ in operators if name.startswith(ATTENTION_PREFIX))
    ops = sum(t for _, t, _ in operators)
    return {
        "matrix products": products,
        "attention": attention,
        "other operators": ops - products - attention,
        "Python, dispatch, profiler": max(wall_seconds - ops, 0.0),
        "operator calls": float(sum(calls for *_, calls in operators)),
    }


def print_profile(title: str, label: str, work: Callable[[], None], rows: int = 15) -> dict:
    """Run `work` under torch's CPU profiler; print `title`, its operators by self time
    (`rows` of them) and one line `# {label}: ... wall under the profiler: <the parts of
    time_breakdown, seconds and shares>; N operator calls`. Returns the breakdown, with
    "wall" (seconds)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        work()
        wall = time.perf_counter() - start
    averages = prof.key_averages()
    print(f"# {title}")
    print(averages.table(sort_by="self_cpu_time_total", row_limit=rows))
    operators = [(e.key, e.self_cpu_time_total / 1e6, e.count) for e in averages]
    parts = time_breakdown(operators, wall)
    calls = parts["operator calls"]
    shares = ", ".join(
        f"{part} {t:.3f} s ({t / wall:.0%})"
        for part, t in parts.items()
        if part != "operator calls"
    )
    print(f"# {label}: {wall:.3f} s wall under the profiler: {shares}; {calls:.0f} operator calls")
    return {**parts, "wall": wall}


# ---------------------------------------------------------------- repeats


@dataclass(frozen=True)
class Spread:
    """The median of repeated measurements, with their range."""

    median: float
    low: float
    high: float
    n: int

    @property
    def relative(self) -> float:
        """(high - low) / median: the repeats' spread as a fraction of the figure."""
        return (self.high - self.low) / self.median if self.median else 0.0

    def __str__(self) -> str:
        if self.n == 1:
            return f"{self.median:,.4g}"
        return f"{self.median:,.4g} (range {self.low:,.4g}-{self.high:,.4g}, n={self.n})"


def spread(values: Sequence[float]) -> Spread:
    if not values:
        raise ValueError("spread of no values")
    return Spread(statistics.median(values), min(values), max(values), len(values))


def median_fields(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The median of every numeric field over runs of one measurement, and the runs."""
    keys = [k for k, v in runs[0].items() if isinstance(v, (int, float))]
    out: dict[str, Any] = {k: statistics.median(r[k] for r in runs) for k in keys}
    out["runs"] = list(runs)
    return out


# ---------------------------------------------------------------- the machine


def load_average() -> float:
    """The 1-minute load average (the machine is shared: other jobs lower the figures)."""
    return os.getloadavg()[0]


def cpu_model() -> str:
    """The CPU's model name, from /proc/cpuinfo, else lscpu, else the platform."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def cpu_flags() -> list[str]:
    """The matrix-relevant instruction sets the CPU has (AVX-512 bf16, AMX, ...)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                have = set(line.split(":", 1)[1].split())
                return [f for f in CPU_FLAGS if f in have]
    return []


def memory_gib() -> float | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    return None


def machine() -> dict[str, Any]:
    """The machine as a report names it; torch's threads as the benchmark set them."""
    import torch

    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "cpu_flags": cpu_flags(),
        "memory_gib": memory_gib(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "openmp_waiting": openmp_waiting(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def describe_machine(m: Mapping[str, Any]) -> str:
    """One line: CPU, cores, flags, torch, threads, load average."""
    load = m.get("load_average", {})
    loads = ", ".join(f"{load[k]:.2f} at the {k}" for k in ("start", "end") if k in load)
    flags = "/".join(m["cpu_flags"]) or "no AVX-512"
    waiting = f", {m['openmp_waiting'].split(' (')[0]}" if m.get("openmp_waiting") else ""
    return (
        f"{m['cpu']}, {m['cores']} cores ({flags}), torch {m['torch']}, "
        f"{m['torch_threads']} torch threads{waiting}"
        + (f"; load average {loads}" if loads else "")
    )


# ---------------------------------------------------------------- report and CLI


@dataclass
class Report:
    """One benchmark run: what was run, where, when, and what it measured."""

    name: str
    command: str
    date: str = field(default_factory=lambda: utc_now())
    load_start: float = field(default_factory=load_average)
    started: float = field(default_factory=time.perf_counter)

    def document(self, figures: Mapping[str, Any]) -> dict[str, Any]:
        """The JSON document (see the module docstring), taken now."""
        m = machine()
        m["load_average"] = {"start": round(self.load_start, 2), "end": round(load_average(), 2)}
        return {
            "schema": SCHEMA,
            "name": self.name,
            "command": self.command,
            "date": self.date,
            "wall_seconds": round(time.perf_counter() - self.started, 1),
            "machine": m,
            "figures": jsonable(figures),
        }


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def jsonable(obj: Any) -> Any:
    """Figures as plain JSON: dataclasses as dicts, tuples as lists, numpy/torch scalars as
    numbers, paths as strings; floats rounded to 6 significant digits."""
    if hasattr(obj, "__dataclass_fields__") and not isinstance(obj, type):
        return jsonable(asdict(obj))
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, bool) or obj is None or isinstance(obj, (str, int)):
        return obj
    if isinstance(obj, float):
        return float(f"{obj:.6g}") if math.isfinite(obj) else None
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if hasattr(obj, "item"):  # numpy and torch scalars
        return jsonable(obj.item())
    return str(obj)


def write_json(document: Mapping[str, Any], path: str | os.PathLike) -> None:
    """Write the report atomically (nmt's one durability rule)."""
    import json

    from nmt.fsutil import atomic_write_text

    atomic_write_text(path, json.dumps(document, indent=1) + "\n")


def json_file(value: str) -> Path:
    """argparse type of --json: a file in an existing folder."""
    path = Path(value)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{value} is a folder; name a file")
    if not path.resolve().parent.is_dir():
        raise argparse.ArgumentTypeError(f"{value}: its folder does not exist")
    return path


def positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value} must be 1 or more")
    return number


def nonnegative_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"{value} must be 0 or more")
    return number


def existing_file(value: str) -> Path:
    if not Path(value).is_file():
        raise argparse.ArgumentTypeError(f"{value}: no such file")
    return Path(value)


def data_dir(value: str) -> Path:
    """argparse type of --data: a data dir written by nmt-preprocess."""
    if not (Path(value) / "meta.json").is_file():
        raise argparse.ArgumentTypeError(
            f"{value}: not a data dir (no meta.json); build one with nmt-preprocess"
        )
    return Path(value)


def parser(name: str, doc: str | None) -> argparse.ArgumentParser:
    """The benchmark's argument parser, with --json FILE."""
    p = argparse.ArgumentParser(
        prog=f"benchmarks.{name}",
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--json",
        type=json_file,
        metavar="FILE",
        help="also write the report as JSON (the schema of benchmarks/common.py)",
    )
    return p


def main(
    name: str,
    build_parser: Callable[[], argparse.ArgumentParser],
    run: Callable[[argparse.Namespace], Mapping[str, Any]],
    argv: Sequence[str] | None = None,
    *,
    passive: bool = False,
) -> int:
    """Parse, run, report. `run` prints its figures and returns them for the JSON report;
    BenchError and nmt's NmtError become `benchmarks.NAME: error: <one line>`, exit 2;
    Ctrl-C a one-line note, exit 130. `passive` (the benchmarks that compute in this
    process): run with OpenMP's passive waiting (see passive_openmp), re-executing the
    command once when torch was loaded before it could be set."""
    from nmt.errors import NmtError

    ap = build_parser()
    args = ap.parse_args(argv)
    if passive and argv is None:
        reexec_passive(name)
    shown = ["python", "-m", f"benchmarks.{name}", *(sys.argv[1:] if argv is None else argv)]
    report = Report(name, shlex.join(shown))
    try:
        figures = run(args)
    except (BenchError, NmtError) as exc:
        line = " ".join(str(exc).strip().splitlines()[:1]) or type(exc).__name__
        print(f"{ap.prog}: error: {line}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{ap.prog}: interrupted; nothing written", file=sys.stderr)
        return 130
    document = report.document(figures)
    print(f"# {describe_machine(document['machine'])}; {document['date']}", flush=True)
    if args.json is not None:
        write_json(document, args.json)
        print(f"# wrote {args.json}", file=sys.stderr)
    return 0


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub Markdown table; cells as str() gives them, `|` escaped."""

    def cell(value: Any) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")

    lines = [
        "| " + " | ".join(cell(h) for h in header) + " |",
        "| " + " | ".join("---" for _ in header) + " |",
    ]
    for row in rows:
        if len(row) != len(header):
            raise ValueError(f"a row of {len(row)} cells under {len(header)} columns")
        lines.append("| " + " | ".join(cell(c) for c in row) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------- subprocesses and peers


@dataclass
class Completed:
    """A finished subprocess: its output, exit code, and what it cost (wait4's rusage:
    its own CPU time and peak resident memory, its waited-for children's included)."""

    returncode: int
    stdout: str
    stderr: str
    wall: float
    cpu: float
    peak_rss_mib: float


def run_subprocess(
    cmd: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
    check: str | None = None,
) -> Completed:
    """Run `cmd` to its end; with `check` (what to call it in an error), a non-zero exit
    is a BenchError quoting the last line of its stderr."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        try:
            proc = subprocess.Popen(
                list(cmd), stdout=out, stderr=err, env=None if env is None else dict(env), cwd=cwd
            )
        except OSError as exc:
            raise BenchError(f"{cmd[0]}: cannot run it ({exc.strerror})") from exc
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        done = Completed(
            returncode=proc.returncode,
            stdout=out.read(),
            stderr=err.read(),
            wall=wall,
            cpu=usage.ru_utime + usage.ru_stime,
            peak_rss_mib=usage.ru_maxrss / 1024,
        )
    if check is not None and done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise BenchError(f"{check} failed (exit {done.returncode}): {last}")
    return done


def python_cli(command: str, overrides: Sequence[str]) -> list[str]:
    """The argv of an nmt console command (nmt-<command>) run by this interpreter."""
    code = f"import sys; from nmt.cli import main; main({command!r}, sys.argv[1:])"
    return [sys.executable, "-c", code, *overrides]


# ---------------------------------------------------------------- paired runs: interleaving


def balanced_orders(n: int) -> list[list[int]]:
    """Orders in which n contestants take their turns, cycled over the turns.

    Over one cycle every contestant runs in every position equally often, and follows
    every other contestant equally often (a Williams design: n orders for even n, 2n for
    odd n). So whatever a position or a predecessor does to a contestant's time (caches
    warmed by the one before, the first run of a fresh batch, a turn boundary) is spread
    evenly over the contestants.
    """
    if n < 1:
        raise ValueError("no contestants")
    first, low, high = [0], 1, n - 1
    while len(first) < n:
        first.append(low)
        low += 1
        if len(first) < n:
            first.append(high)
            high -= 1
    orders = [[(c + shift) % n for c in first] for shift in range(n)]
    if n % 2:
        orders += [list(reversed(o)) for o in orders]
    return _chained(orders)


def _chained(orders: list[list[int]]) -> list[list[int]]:
    """The same orders, arranged so that no contestant runs twice in a row at a turn's
    boundary, the cycle's own end included (it repeats). For odd n the reversed orders
    appended as they are put contestants 0 and 1 after themselves once per cycle and
    the others never: a bias. For n = 2 no arrangement avoids it, and both contestants
    follow themselves equally often."""

    def search(chain: list[list[int]], left: list[list[int]]) -> list[list[int]] | None:
        if not left:
            return chain if chain[-1][-1] != chain[0][0] else None
        for i, order in enumerate(left):
            if order[0] != chain[-1][-1]:
                found = search([*chain, order], left[:i] + left[i + 1 :])
                if found is not None:
                    return found
        return None

    return search(orders[:1], orders[1:]) or orders


def interleave(
    contestants: Sequence[Callable[[int], Any]],
    turns: int,
    *,
    on_turn: Callable[[int, list[Timing]], None] | None = None,
    sync: Callable[[], None] | None = None,
) -> list[list[Timing]]:
    """Run every contestant once per turn (contestant(turn)), in balanced_orders, timing
    each run: timings[contestant][turn]. `on_turn(turn, that turn's timings)` reports
    progress; `sync`: see `timed` (torch.cuda.synchronize for work on a GPU)."""
    orders = balanced_orders(len(contestants))
    timings: list[list[Timing]] = [[] for _ in contestants]
    for turn in range(turns):
        this_turn: list[Timing] = [Timing() for _ in contestants]
        for c in orders[turn % len(orders)]:
            with timed(sync) as t:
                contestants[c](turn)
            this_turn[c] = t
            timings[c].append(t)
        if on_turn is not None:
            on_turn(turn, this_turn)
    return timings


@dataclass(frozen=True)
class PairedRatio:
    """How much faster `other` ran than `base` over the same turns, with its noise.

    ratio = base's seconds / other's seconds, both summed over the turns (the same work
    per turn), so > 1 means `other` is faster. low-high is a 95% bootstrap interval over
    the turns: an A/A comparison (the same code on both sides) should contain 1.
    """

    ratio: float
    low: float
    high: float
    turns: int
    per_turn: tuple[float, ...]

    @property
    def noise(self) -> float:
        """Half the interval's width: the ratio's own noise."""
        return (self.high - self.low) / 2

    def __str__(self) -> str:
        quartiles = statistics.quantiles(self.per_turn, n=4) if self.turns > 1 else [self.ratio] * 3
        return (
            f"{self.ratio:.3f} ± {self.noise:.3f} (95% interval {self.low:.3f}-{self.high:.3f}; "
            f"per-turn ratios: median {statistics.median(self.per_turn):.3f}, quartiles "
            f"{quartiles[0]:.3f}-{quartiles[2]:.3f}, {self.turns} turns)"
        )


def paired_ratio(
    base: Sequence[float], other: Sequence[float], *, resamples: int = 4000, seed: int = 0
) -> PairedRatio:
    """The speed of `other` over `base` from their seconds per turn (see PairedRatio)."""
    import numpy as np

    b, o = np.asarray(base, dtype=np.float64), np.asarray(other, dtype=np.float64)
    if len(b) != len(o) or not len(b):
        raise ValueError("paired_ratio needs the same number of turns, at least one, on each side")
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(b), size=(resamples, len(b)))  # turns drawn with replacement
    boot = b[picks].sum(axis=1) / o[picks].sum(axis=1)
    low, high = np.quantile(boot, [0.025, 0.975])
    return PairedRatio(
        ratio=float(b.sum() / o.sum()),
        low=float(low),
        high=float(high),
        turns=len(b),
        per_turn=tuple(float(x) for x in b / o),
    )


def paired_ratios(base: Sequence[Timing], other: Sequence[Timing]) -> dict[str, PairedRatio]:
    """paired_ratio of wall time and of CPU time: {"wall": ..., "cpu": ...}.

    On a loaded machine the CPU time a turn costs (OpenMP threads waiting passively, see
    passive_openmp) varies far less than its wall time: its ratio is the tighter reading
    of a code change; the wall-clock ratio is what a user waits."""
    return {
        "wall": paired_ratio([t.wall for t in base], [t.wall for t in other]),
        "cpu": paired_ratio([t.cpu for t in base], [t.cpu for t in other]),
    }


_SET_BY_US = "BENCHMARKS_SET_OMP_WAIT_POLICY"  # marks the variable as the benchmark's own


def reexec_passive(name: str) -> None:
    """Unless OMP_WAIT_POLICY is set: set it to PASSIVE and run `python -m
    benchmarks.<name>` again with the same arguments (OpenMP reads it when torch loads,
    which the module's imports have done already). Returns only when it is set."""
    if os.environ.get("OMP_WAIT_POLICY"):
        return
    if "torch" not in sys.modules:
        passive_openmp()
        return
    passive_environment()
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", f"benchmarks.{name}", *sys.argv[1:]])


def passive_environment() -> None:
    """OMP_WAIT_POLICY=PASSIVE in this process's environment, for the torch it has yet to
    load and for its subprocesses, unless the variable is set already."""
    if not os.environ.get("OMP_WAIT_POLICY"):
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        os.environ[_SET_BY_US] = "1"


def openmp_waiting() -> str:
    """A line saying which OpenMP waiting is in effect (for the report)."""
    policy = os.environ.get("OMP_WAIT_POLICY")
    if not policy:
        return "OMP_WAIT_POLICY unset: OpenMP's default waiting (spinning)"
    if os.environ.get(_SET_BY_US):
        return (
            f"OMP_WAIT_POLICY={policy} (set by the benchmark; OMP_WAIT_POLICY=ACTIVE to override)"
        )
    return f"OMP_WAIT_POLICY={policy} (from the environment)"


def passive_openmp() -> str:
    """Make torch's OpenMP threads sleep instead of spin when they wait (the paired
    benchmarks call it first thing), unless OMP_WAIT_POLICY is set already; returns a
    line saying what is in effect.

    Spinning threads burn the CPU while they wait for a thread the OS has descheduled: on
    a shared machine that makes both wall and CPU time depend on the neighbours. OpenMP
    reads the variable once, when torch loads, so it must be set before that.
    """
    if os.environ.get("OMP_WAIT_POLICY"):
        return openmp_waiting()
    if "torch" in sys.modules:
        return "OMP_WAIT_POLICY unset, torch already loaded: OpenMP's default waiting"
    passive_environment()
    return openmp_waiting()


# ---------------------------------------------------------------- paired runs: git revisions


def git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["git failed"])[-1]
        raise BenchError(f"git {' '.join(args)}: {last}")
    return done.stdout.strip()


def revision_id(rev: str) -> str:
    """The short commit hash of `rev`; a BenchError naming it when it is none."""
    try:
        return git("rev-parse", "--short", "--verify", "--quiet", f"{rev}^{{commit}}")
    except BenchError:
        raise BenchError(f"--before {rev}: not a revision of this repository") from None


def worktree_id() -> str:
    """HEAD's short hash, with '+changes' when nmt/ or configs/ differ from it."""
    head = git("rev-parse", "--short", "HEAD")
    dirty = git("status", "--porcelain", "--", "nmt", "configs")
    return head + ("+changes" if dirty else "")


_EXPORTS: dict[str, str] = {}  # package name -> commit it was imported from


def import_revision(rev: str, name: str | None = None) -> ModuleType:
    """nmt as of git revision `rev`, imported as the package `name` (default
    nmt_at_<commit>), beside the working tree's `nmt` in this process.

    `git archive` exports nmt/ and configs/ of the revision into a temporary folder
    (removed at exit), nmt/ renamed to `name` and its absolute imports (`from nmt...`,
    `import nmt...`, "nmt.x" module strings) rewritten to it. The package is imported
    from its folder by location, without touching sys.path.
    """
    commit = revision_id(rev)
    name = name or f"nmt_at_{commit}"
    if name in sys.modules:
        if _EXPORTS.get(name) == commit:
            return sys.modules[name]
        raise BenchError(f"{name} is already imported (from {_EXPORTS.get(name, 'elsewhere')})")
    dest = Path(tempfile.mkdtemp(prefix=f"{name}-{commit}-"))
    atexit.register(shutil.rmtree, dest, True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", commit, "nmt", "configs"], capture_output=True
    )
    if archive.returncode != 0:
        last = archive.stderr.decode(errors="replace").strip().splitlines()[-1:]
        raise BenchError(f"--before {rev}: cannot export nmt/ and configs/ ({' '.join(last)})")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(dest, filter="data")
    package = dest / name
    (dest / "nmt").rename(package)
    for path in package.rglob("*.py"):
        path.write_text(rename_imports(path.read_text(encoding="utf-8"), name), encoding="utf-8")
    spec = importlib.util.spec_from_file_location(
        name, package / "__init__.py", submodule_search_locations=[str(package)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    _EXPORTS[name] = commit
    return module


def rename_imports(source: str, name: str) -> str:
    """Python source of nmt with its absolute self-references pointing to `name`."""
    source = re.sub(r"\b(from|import) nmt\b", rf"\1 {name}", source)
    return re.sub(r"""(["'])nmt\.""", rf"\1{name}.", source)


# ---------------------------------------------------------------- adapters: one API over revisions


def train_config(package: str, overrides: Sequence[str]) -> Any:
    """`package`'s TrainConfig composed from configs/train.yaml and `overrides`, by that
    package's own config code (so each version gets its own defaults). Overrides use the
    working tree's key names; a revision before TrainConfig's sections (0.1) gets the flat
    names they replaced (valid_split=, log_interval=, ...)."""
    cli = importlib.import_module(f"{package}.cli")
    schema = importlib.import_module(f"{package}.training.config").TrainConfig
    if "validation" not in {f.name for f in dataclasses.fields(schema)}:
        overrides = flat_train_overrides(overrides)
    return cli.to_dataclass(cli.compose_config("train", list(overrides)))


def flat_train_overrides(overrides: Sequence[str]) -> list[str]:
    """`overrides` with each sectioned nmt-train key (validation.split=) written with its
    flat name of 0.1 (valid_split=), as nmt.config.DEPRECATED_KEYS maps them."""
    from nmt.config import DEPRECATED_KEYS

    flat = {new: old for old, (new, _) in DEPRECATED_KEYS["train"].items()}
    renamed = []
    for override in overrides:
        key, sep, value = override.partition("=")
        renamed.append(f"{flat.get(key, key)}{sep}{value}")
    return renamed


@dataclass
class TrainerHandle:
    """A Trainer of any nmt revision behind the calls the benchmarks make."""

    trainer: Any
    step: Callable[[list[Any]], None]  # step([batch]): one optimizer update

    @classmethod
    def build(cls, package: str, cfg: Any) -> TrainerHandle:
        """nmt.training.build_training(cfg) and nmt.training.step.train_step over it (the
        library since issue 47); its Trainer's train_step method (issue 16 to 0.1); or, in
        revisions before issue 16 (f3ffaaf), nmt.training.trainer.Trainer(cfg) and its
        _train_step."""
        training = importlib.import_module(f"{package}.training")
        if hasattr(training, "build_training"):
            trainer = training.build_training(cfg)
        else:
            trainer = importlib.import_module(f"{package}.training.trainer").Trainer(cfg)
        step = getattr(trainer, "train_step", None) or getattr(trainer, "_train_step", None)
        if step is None:
            steps = importlib.import_module(f"{package}.training.step")
            step = functools.partial(steps.train_step, trainer)
        return cls(trainer, step)


TranslateIds = Callable[[Sequence[Any]], list[list[int]]]


def translator_of(
    package: str,
    checkpoint: str | os.PathLike,
    *,
    beam: int,
    max_len_a: float,
    max_len_b: int,
    max_sentences: int,
    precision: str = "fp32",
    device: str = "cpu",
) -> TranslateIds:
    """translate(list of source ids, each ending in EOS) -> the best hypothesis' tokens
    per source, by `package`'s translation core: nmt.generation.translator.Translator
    (since issue 16), or nmt.commands.generate.Translator in revisions before it."""
    import torch

    loading = f"{package}.generation.loading"  # nmt.checkpoint's load_for_inference before
    if importlib.util.find_spec(loading) is None:
        loading = f"{package}.checkpoint"
    config = importlib.import_module(f"{package}.generation.config")
    dev = torch.device(device)
    model = importlib.import_module(loading).load_for_inference(str(checkpoint), dev)
    search = dict(beam=beam, max_len_a=max_len_a, max_len_b=max_len_b)
    if importlib.util.find_spec(f"{package}.generation.translator") is not None:
        library = importlib.import_module(f"{package}.generation.translator")
        runtime = importlib.import_module(f"{package}.runtime")
        core = library.Translator(
            [model.model],
            model.src_tokenizer,
            model.tgt_tokenizer,
            search=config.SearchConfig(**search),
            runtime=runtime.Runtime(dev, precision),
            max_sentences=max_sentences,
        )

        def translate(sources: Sequence[Any]) -> list[list[int]]:
            return [hyps[0].tokens.tolist() for hyps in core.translate_ids(sources)]

        return translate
    command = importlib.import_module(f"{package}.commands.generate")
    generator = importlib.import_module(f"{package}.generation.generator")
    source = importlib.import_module(f"{package}.generation.io").Source
    cfg = config.GenerateConfig(**search, max_sentences=max_sentences, dtype=precision)
    old = command.Translator(generator.SequenceGenerator([model.model], cfg), cfg, dev, None)

    def translate_old(sources: Sequence[Any]) -> list[list[int]]:
        hyps = old([source(i, ids, "") for i, ids in enumerate(sources)])
        return [hyps[i][0].tokens.tolist() for i in range(len(sources))]

    return translate_old
