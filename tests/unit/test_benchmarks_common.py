"""benchmarks.common: timing, the balanced order of paired turns, the paired ratio and its
noise, the report's schema, Markdown tables, one-line errors, and the import of a git
revision beside the working tree."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from collections import Counter

import numpy as np
import pytest

from benchmarks import common
from nmt.errors import NmtError


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6])
def test_balanced_orders_give_every_position_and_predecessor_equally_often(n):
    orders = common.balanced_orders(n)
    assert len(orders) == (n if n % 2 == 0 else 2 * n)
    assert all(sorted(o) == list(range(n)) for o in orders)
    positions = Counter((c, k) for o in orders for k, c in enumerate(o))
    assert set(positions.values()) == {len(orders) // n}  # each contestant in each position
    if n > 1:
        follows = Counter((a, b) for o in orders for a, b in itertools.pairwise(o))
        assert len(follows) == n * (n - 1)  # every ordered pair of different contestants
        assert len(set(follows.values())) == 1  # ... equally often


@pytest.mark.parametrize("n", [3, 4, 5, 6])
def test_balanced_orders_never_run_a_contestant_twice_in_a_row(n):
    cycle = common.balanced_orders(n)
    sequence = [c for o in cycle + cycle for c in o]
    assert all(a != b for a, b in itertools.pairwise(sequence))


def test_two_contestants_follow_themselves_equally_often():
    cycle = common.balanced_orders(2)
    sequence = [c for o in cycle for c in o] + [cycle[0][0]]  # the cycle, and its repeat's start
    repeats = Counter(a for a, b in itertools.pairwise(sequence) if a == b)
    assert repeats[0] == repeats[1] > 0  # unavoidable with position balance, but even


def test_the_old_forward_backward_alternation_was_not_balanced():
    """What the first paired training benchmark did with 4 trainers: the last trainer of
    a turn ran again first in the next, and always the same two did."""
    forward = [0, 1, 2, 3]
    sequence = [c for turn in range(8) for c in (forward if turn % 2 == 0 else forward[::-1])]
    repeats = {a for a, b in itertools.pairwise(sequence) if a == b}
    assert repeats == {0, 3}


def test_interleave_runs_each_contestant_once_per_turn_in_the_balanced_order():
    calls: list[tuple[int, int]] = []
    seen: list[int] = []

    def contestant(i):
        return lambda turn: calls.append((i, turn))

    timings = common.interleave(
        [contestant(i) for i in range(3)], 7, on_turn=lambda turn, ts: seen.append(len(ts))
    )
    assert [len(t) for t in timings] == [7, 7, 7]
    assert seen == [3] * 7
    orders = common.balanced_orders(3)
    for turn in range(7):
        assert [c for c, t in calls[3 * turn : 3 * turn + 3]] == orders[turn % len(orders)]
        assert {t for _, t in calls[3 * turn : 3 * turn + 3]} == {turn}


def test_timed_measures_wall_and_cpu_time():
    with common.timed() as t:
        end = time.process_time() + 0.05
        while time.process_time() < end:  # busy for 0.05 CPU-seconds, however loaded
            pass
    assert 0.05 <= t.cpu <= t.wall + 0.01 < 5
    with common.timed() as idle:
        time.sleep(0.05)
    assert idle.wall >= 0.05 and idle.cpu < idle.wall


def test_paired_ratio_of_equal_times_is_one_with_no_noise():
    r = common.paired_ratio([2.0] * 8, [2.0] * 8)
    assert r.ratio == pytest.approx(1.0) and r.low == pytest.approx(1.0) == r.high
    assert r.noise == pytest.approx(0.0)


def test_paired_ratio_reads_the_other_side_speed_over_the_base():
    r = common.paired_ratio([2.0, 4.0, 3.0], [1.0, 2.0, 1.5])  # other takes half the time
    assert r.ratio == pytest.approx(2.0)
    assert r.per_turn == pytest.approx((2.0, 2.0, 2.0))


def test_paired_ratio_of_an_a_a_run_contains_one_within_its_noise():
    rng = np.random.default_rng(3)
    drift = 1.0 + 0.3 * np.sin(np.arange(40) / 4)  # the machine's speed wanders
    a = drift * rng.lognormal(0.0, 0.15, 40)  # both sides: the same work, own noise
    b = drift * rng.lognormal(0.0, 0.15, 40)
    r = common.paired_ratio(a, b)
    assert r.low <= 1.0 <= r.high
    assert 0.0 < r.noise < 0.2
    assert f"{r.ratio:.3f} ± {r.noise:.3f}" in str(r)
    shifted = common.paired_ratio(a * 1.5, b)  # b 1.5x faster: shown, outside the noise
    assert shifted.low > 1.2


def test_paired_ratio_needs_turns_on_both_sides():
    with pytest.raises(ValueError):
        common.paired_ratio([1.0, 2.0], [1.0])
    with pytest.raises(ValueError):
        common.paired_ratio([], [])


def test_spread_and_median_fields():
    s = common.spread([3.0, 1.0, 2.0])
    assert (s.median, s.low, s.high, s.n) == (2.0, 1.0, 3.0, 3)
    assert s.relative == pytest.approx(1.0)
    assert "range 1-3" in str(s)
    m = common.median_fields([{"a": 1.0, "b": "x"}, {"a": 3.0, "b": "y"}, {"a": 2.0, "b": "z"}])
    assert m["a"] == 2.0 and "b" not in m and len(m["runs"]) == 3


def test_markdown_table():
    table = common.markdown_table(["what", "n"], [["a|b", 1], ["c", 2.5]])
    assert table.splitlines() == ["| what | n |", "| --- | --- |", "| a\\|b | 1 |", "| c | 2.5 |"]
    with pytest.raises(ValueError):
        common.markdown_table(["one"], [["a", "b"]])


def test_machine_names_the_cpu_and_torch():
    import torch

    m = common.machine()
    assert m["cpu"] and m["cores"] >= 1 and m["torch"] == torch.__version__
    assert m["torch_threads"] == torch.get_num_threads()
    m["load_average"] = {"start": 1.0, "end": 2.0}
    line = common.describe_machine(m)
    assert m["cpu"] in line and "load average 1.00 at the start" in line


def test_jsonable_turns_figures_into_plain_json():
    r = common.paired_ratio([1.0, 1.0], [1.0, 1.0])
    doc = common.jsonable(
        {"r": r, "n": np.int64(3), "x": np.float32(0.5), "nan": float("nan"), "t": (1, 2)}
    )
    assert doc["r"]["ratio"] == 1.0 and doc["r"]["per_turn"] == [1.0, 1.0]
    assert doc["n"] == 3 and doc["x"] == 0.5 and doc["nan"] is None and doc["t"] == [1, 2]
    json.dumps(doc)


def _toy_parser():
    p = common.parser("toy", "A toy benchmark.")
    p.add_argument("--n", type=common.positive_int, default=2)
    p.add_argument("--fail", choices=["bench", "nmt"])
    return p


def _toy_run(args: argparse.Namespace) -> dict:
    if args.fail == "bench":
        raise common.BenchError("--n 2: a problem the user can fix\nsecond line")
    if args.fail == "nmt":
        raise NmtError("data=x: no such data dir; build one")
    print(f"toy: {args.n} things")
    return {"things": args.n, "spread": common.spread([1.0, 2.0])}


def test_main_writes_one_json_schema(tmp_path, capsys):
    out = tmp_path / "toy.json"
    assert common.main("toy", _toy_parser, _toy_run, ["--n", "3", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert set(doc) == {"schema", "name", "command", "date", "wall_seconds", "machine", "figures"}
    assert doc["schema"] == common.SCHEMA and doc["name"] == "toy"
    assert doc["command"] == f"python -m benchmarks.toy --n 3 --json {out}"
    assert doc["date"].endswith("Z") and doc["figures"]["things"] == 3
    assert doc["figures"]["spread"]["median"] == 1.5
    assert set(doc["machine"]["load_average"]) == {"start", "end"}
    assert "toy: 3 things" in capsys.readouterr().out


@pytest.mark.parametrize("fail", ["bench", "nmt"])
def test_main_turns_user_errors_into_one_line(fail, capsys):
    assert common.main("toy", _toy_parser, _toy_run, ["--fail", fail]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("benchmarks.toy: error: ")
    assert "Traceback" not in err[0]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--n", "0"], "0 must be 1 or more"),
        (["--n", "x"], "'x' is not an integer"),
        (["--json", "/no/such/folder/out.json"], "its folder does not exist"),
    ],
)
def test_bad_arguments_are_argparse_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        common.main("toy", _toy_parser, _toy_run, argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "benchmarks.toy: error:" in err and message in err


def test_run_subprocess_reports_cost_and_failures():
    done = common.run_subprocess([sys.executable, "-c", "print('hi'); sum(range(10**6))"])
    assert done.returncode == 0 and done.stdout == "hi\n"
    assert done.wall > 0 and done.cpu > 0 and done.peak_rss_mib > 1
    with pytest.raises(common.BenchError, match=r"peer failed \(exit 3\): boom"):
        common.run_subprocess(
            [sys.executable, "-c", "import sys; print('boom', file=sys.stderr); sys.exit(3)"],
            check="peer",
        )
    with pytest.raises(common.BenchError, match="cannot run it"):
        common.run_subprocess(["/no/such/program"])


def test_rename_imports_points_nmt_at_the_copy():
    source = (
        "import nmt\nimport nmt.data.config as c\nfrom nmt.errors import NmtError\n"
        'LAZY = {"Translator": "nmt.generation.translator"}\n'
        "x = 'nmt.cli'\nimport nmt_other\nname = \"nmt-train\"\n"
    )
    out = common.rename_imports(source, "nmt_before")
    assert out == (
        "import nmt_before\nimport nmt_before.data.config as c\n"
        "from nmt_before.errors import NmtError\n"
        'LAZY = {"Translator": "nmt_before.generation.translator"}\n'
        "x = 'nmt_before.cli'\nimport nmt_other\nname = \"nmt-train\"\n"
    )


def test_import_revision_loads_a_second_nmt_beside_the_working_tree():
    from importlib import import_module

    import nmt.errors

    before = common.import_revision("HEAD", "nmt_rev_head")
    assert before.__name__ == "nmt_rev_head"
    errors = import_module("nmt_rev_head.errors")
    assert errors.NmtError is not nmt.errors.NmtError  # a copy, not the working tree's
    assert "nmt_rev_head" in errors.__file__ and "nmt_rev_head" not in sys.path
    assert common.import_revision("HEAD", "nmt_rev_head") is before  # once per process
    config = import_module("nmt_rev_head.training.config")
    assert config.TrainConfig.__module__ == "nmt_rev_head.training.config"


def test_import_revision_refuses_an_unknown_revision():
    with pytest.raises(common.BenchError, match="--before no-such-rev: not a revision"):
        common.import_revision("no-such-rev", "nmt_rev_bad")
    assert "nmt_rev_bad" not in sys.modules


@pytest.mark.parametrize("batches", [3, 4])
def test_generate_paired_gives_every_batch_both_orders_over_two_passes(batches):
    from benchmarks.generate_paired import pass_turns

    turns = pass_turns(2, batches)
    assert sorted(turns) == [(p, i) for p in range(2) for i in range(batches)]
    orders = common.balanced_orders(2)
    first = {}  # batch -> the version first in its turn, per pass
    for turn, (_, batch) in enumerate(turns):
        first.setdefault(batch, []).append(orders[turn % len(orders)][0])
    assert all(sorted(f) == [0, 1] for f in first.values())


def test_passive_waiting_reexecutes_a_command_line_run_once(monkeypatch):
    environ = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    monkeypatch.setattr(os, "environ", environ)
    monkeypatch.setattr(sys, "argv", ["/x/benchmarks/train.py", "--data", "d"])
    calls = []
    monkeypatch.setattr(os, "execv", lambda exe, argv: calls.append((exe, argv)))
    assert "torch" in sys.modules  # loaded by the imports, so the variable comes too late
    common.reexec_passive("train")
    assert calls == [(sys.executable, [sys.executable, "-m", "benchmarks.train", "--data", "d"])]
    assert environ["OMP_WAIT_POLICY"] == "PASSIVE"
    assert common.openmp_waiting().startswith("OMP_WAIT_POLICY=PASSIVE (set by the benchmark")
    common.reexec_passive("train")  # the re-executed run: set, so it goes on
    assert len(calls) == 1


def test_a_policy_from_the_environment_is_kept(monkeypatch):
    monkeypatch.setattr(os, "environ", {"OMP_WAIT_POLICY": "ACTIVE"})
    monkeypatch.setattr(os, "execv", lambda *a: pytest.fail("no re-exec"))
    common.reexec_passive("train")
    assert common.openmp_waiting() == "OMP_WAIT_POLICY=ACTIVE (from the environment)"
    assert common.machine()["openmp_waiting"] == common.openmp_waiting()


def test_main_never_reexecutes_an_in_process_call(monkeypatch, capsys):
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items()})
    os.environ.pop("OMP_WAIT_POLICY", None)
    monkeypatch.setattr(os, "execv", lambda *a: pytest.fail("no re-exec"))
    code = common.main("x", lambda: common.parser("x", None), lambda a: {}, [], passive=True)
    assert code == 0 and "OMP_WAIT_POLICY" not in os.environ
