"""Reliability of nmt-generate and nmt-score (issue 17, generation): invalid UTF-8 late in
an input (input_errors=strict|replace), min_len beyond the longest output, an output that
is one of the inputs, a terminal as stdin, kill -9 while the output file is written.

The cases a user meets as processes run the console scripts as real processes (a real
pipe, a real pseudo-terminal, a real kill -9); the others go through `nmt.cli.main`
in-process, which is the same code without the seconds of a process start.
"""

from __future__ import annotations

import io
import json
import os
import pty
import signal
import subprocess
import sys
import textwrap
import time
import tracemalloc
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import TINY_MODEL, run_training, tiny_config

from nmt.errors import NmtError
from nmt.fsutil import stale_temps

BIN = Path(sys.executable).parent
DEMO = Path(__file__).resolve().parents[2] / "data" / "demo"
PROMPT = "reading sentences from the terminal"

pytestmark = pytest.mark.usefixtures("one_thread")


def one_line_error(code: int, err: str, command: str, *needles: str) -> str:
    """Exit 2, exactly one `nmt-<command>: error:` line on stderr naming every needle."""
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith(f"nmt-{command}: error: "), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def ckpt(demo_data_dir, tmp_path_factory) -> Path:
    """A tiny model after one update: it translates badly and slowly (it rarely stops
    before its length limit), with short position tables (64 source, 32 target)."""
    save_dir = tmp_path_factory.mktemp("generation-run")
    model = replace(TINY_MODEL, max_source_positions=64, max_target_positions=32)
    run_training(tiny_config(demo_data_dir, save_dir, max_update=1, model=model))
    return save_dir / "checkpoint_last.pt"


def demo_lines(n: int, split: str = "test") -> list[str]:
    return (DEMO / f"{split}.en").read_text(encoding="utf-8").splitlines()[:n]


def write_lines(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return path


def generate_args(ckpt: Path, *extra: str) -> list[str]:
    return [f"checkpoint={ckpt}", "device=cpu", "threads=1", "beam=2", "max_len_b=8", *extra]


def translations(nmt_cli, ckpt: Path, path: Path, *extra: str) -> list[str]:
    """What nmt-generate prints for the file `path`, each line."""
    code, out, err = nmt_cli("generate", *generate_args(ckpt, f"input={path}", *extra))
    assert code == 0, err
    return out.splitlines()


# ------------------------------------------------------------------ invalid UTF-8 (item 7)


def test_invalid_utf8_late_in_a_file_is_refused_before_translating(ckpt, tmp_path):
    """The console script: a bad line 41 of 45 stops the run before any translation, the
    error names the file and line, the previous output file is untouched and a new one is
    never created."""
    good = [line.encode() for line in demo_lines(45)]
    bad = write_lines(tmp_path / "bad.en", good[:40] + [b"a caf\xe9 in latin-1"] + good[40:44])
    previous = tmp_path / "previous.de"
    previous.write_text("the complete translations of an earlier run\n", encoding="utf-8")
    before = previous.read_bytes()
    for output in (previous, tmp_path / "new.de"):
        run = subprocess.run(
            [str(BIN / "nmt-generate"), *generate_args(ckpt, f"input={bad}", f"output={output}")],
            capture_output=True,
            text=True,
            timeout=300,
        )
        line = one_line_error(run.returncode, run.stderr, "generate", f"{bad}:41: invalid UTF-8")
        assert line.endswith("fix the line, or input_errors=replace")
        assert "translated" not in run.stderr
    assert previous.read_bytes() == before
    assert not (tmp_path / "new.de").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.en", "previous.de"]


def test_the_file_is_checked_before_the_model_is_loaded(nmt_cli, tmp_path):
    """Nothing is loaded, let alone translated, before the check: a missing checkpoint is
    not even looked at."""
    bad = write_lines(tmp_path / "bad.en", [b"one", b"two \xff"])
    code, _, err = nmt_cli(
        "generate", f"checkpoint={tmp_path / 'missing.pt'}", f"input={bad}", "device=cpu"
    )
    one_line_error(code, err, "generate", f"{bad}:2: invalid UTF-8")


def test_invalid_utf8_in_ref_and_prefix_file_is_refused_naming_the_line(nmt_cli, ckpt, tmp_path):
    src = write_lines(tmp_path / "in.en", [line.encode() for line in demo_lines(5)])
    side = write_lines(tmp_path / "side.de", [b"ein", b"zwei", b"drei", b"vier \xc3", b"fuenf"])
    out = tmp_path / "out.de"
    for key, extra in (("ref", []), ("prefix_file", []), ("ref", ["score_reference=true"])):
        code, _, err = nmt_cli(
            "generate",
            *generate_args(ckpt, f"input={src}", f"{key}={side}", f"output={out}"),
            *extra,
        )
        one_line_error(code, err, "generate", f"{side}:4: invalid UTF-8", "input_errors=replace")
    assert not out.exists()


def test_invalid_utf8_on_a_pipe_prints_the_lines_before_then_fails(nmt_cli, ckpt, tmp_path):
    """The console script reading a real pipe: the translations of lines 1-6 come out on
    stdout, then a one-line error names <stdin>:7; no terminal prompt on a pipe."""
    good = [line.encode() for line in demo_lines(9)]
    data = b"".join(line + b"\n" for line in good[:6] + [b"\x80 stray byte"] + good[6:])
    run = subprocess.run(
        [str(BIN / "nmt-generate"), *generate_args(ckpt)],
        input=data,
        capture_output=True,
        timeout=300,
    )
    err = run.stderr.decode()
    line = one_line_error(run.returncode, err, "generate", "<stdin>:7: invalid UTF-8")
    assert "the 6 lines before it are translated on stdout" in line and PROMPT not in err
    expected = translations(nmt_cli, ckpt, write_lines(tmp_path / "first6.en", good[:6]))
    assert run.stdout.decode().splitlines() == expected


@pytest.mark.parametrize("interactive", ["true", "false"])
def test_a_bad_stdin_line_keeps_the_translations_before_it_in_output(
    nmt_cli, ckpt, tmp_path, monkeypatch, interactive
):
    """Read ahead in chunks (interactive=false) or line by line, into output=: the lines
    before the bad one are translated and the file holds them (stdin cannot be read again,
    so that work is kept), and the error says where they are."""
    good = [line.encode() for line in demo_lines(9)]
    data = b"".join(line + b"\n" for line in good[:6] + [b"\xed\xa0\x80 a surrogate"] + good[6:])
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    out = tmp_path / "out.de"
    code, _, err = nmt_cli(
        "generate", *generate_args(ckpt, f"output={out}", f"interactive={interactive}")
    )
    one_line_error(code, err, "generate", "<stdin>:7: invalid UTF-8", f"translated in {out}")
    expected = translations(nmt_cli, ckpt, write_lines(tmp_path / "first6.en", good[:6]))
    assert out.read_text(encoding="utf-8").splitlines() == expected


def test_replace_translates_every_line_and_counts_the_replaced_ones(nmt_cli, ckpt, tmp_path):
    good = [line.encode() for line in demo_lines(8)]
    raw = good[:2] + [good[2] + b" \xff\xfe"] + good[3:6] + [b"\xc3(" + good[6]] + good[7:]
    bad = write_lines(tmp_path / "bad.en", raw)
    # what the replacement means: the same line with U+FFFD where the bytes were invalid
    decoded = tmp_path / "decoded.en"
    decoded.write_text(bad.read_bytes().decode("utf-8", errors="replace"), encoding="utf-8")
    assert "\ufffd" in decoded.read_text(encoding="utf-8")
    code, out, err = nmt_cli(
        "generate", *generate_args(ckpt, f"input={bad}", "input_errors=replace")
    )
    assert code == 0, err
    assert out.splitlines() == translations(nmt_cli, ckpt, decoded)
    assert len(out.splitlines()) == 8
    assert f"{bad}: 2 lines had invalid UTF-8, replaced by U+FFFD (the first: line 3)" in err
    # ref= and prefix_file= are replaced and counted as well, each on its own line
    side = write_lines(tmp_path / "side.de", [b"ein \xff"] * 8)
    code, out, err = nmt_cli(
        "generate",
        *generate_args(
            ckpt, f"input={bad}", "input_errors=replace", f"ref={side}", f"prefix_file={side}"
        ),
    )
    assert code == 0 and len(out.splitlines()) == 8, err
    assert err.count(f"{side}: 8 lines had invalid UTF-8") == 2


def test_the_pre_check_streams_the_file(tmp_path):
    """The check before translation reads the file a block at a time (a few MiB): its peak
    memory is the same for an 8x larger file, and far below that file's size (the bad
    byte is on the last line, so the whole file is read)."""
    from nmt.generation.io import scan_text_file

    line = b"a dog runs on the grass in the park with a red ball .\n"
    peaks = []
    for mib in (8, 64):
        path = tmp_path / f"{mib}.en"
        with open(path, "wb") as f:
            for _ in range(mib):
                f.write(line * ((1 << 20) // len(line)))
            f.write(b"the last line \xff\n")
        lines = (1 << 20) // len(line) * mib + 1
        tracemalloc.start()
        try:
            with pytest.raises(NmtError, match=rf"{path.name}:{lines}: invalid UTF-8"):
                scan_text_file(str(path), "input", "strict")
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
        path.unlink()
    assert peaks[1] < 1.5 * peaks[0] and peaks[1] < (64 << 20) // 2, peaks


# ------------------------------------------------------------------ min_len (item 11)


def test_min_len_beyond_the_longest_output_is_refused_naming_both(nmt_cli, ckpt, tmp_path):
    src = write_lines(tmp_path / "in.en", [b"a dog"])
    cases = [
        # known from the options alone: also refused by --cfg, before any model is loaded
        (["min_len=20", "max_len_b=5"], ["min_len=20", "max_len_b=5"]),
        # the model's 32 target positions allow 31 tokens
        (["min_len=40", "max_len_b=200"], ["min_len=40", "model.max_target_positions=32"]),
        # 0.25 x the longest source (64 positions) + 5 = 21
        (
            ["min_len=30", "max_len_a=0.25", "max_len_b=5"],
            ["min_len=30", "max_len_a=0.25", "max_len_b=5", "= 21"],
        ),
    ]
    for options, needles in cases:
        code, _, err = nmt_cli(
            "generate", f"checkpoint={ckpt}", f"input={src}", "device=cpu", *options
        )
        one_line_error(code, err, "generate", *needles)
    code, _, err = nmt_cli("generate", "--cfg", "min_len=20", "max_len_b=5")
    one_line_error(code, err, "generate", "min_len=20", "max_len_b=5")

    from nmt import Translator

    with pytest.raises(NmtError, match="model.max_target_positions=32"):
        Translator.from_checkpoint(ckpt, device="cpu", min_len=40)


def test_a_sentence_whose_limit_is_below_min_len_ends_at_its_limit(nmt_cli, ckpt, tmp_path):
    """max_len_a=1 max_len_b=0: a sentence may have as many tokens as its source has ids.
    Those with fewer than min_len=12 still get a translation, exactly at their limit (the
    limit wins), the others at least 12 tokens; the end note counts the short ones."""
    from nmt import Translator

    lines = demo_lines(30)
    src = write_lines(tmp_path / "in.en", [line.encode() for line in lines])
    encoder = Translator.from_checkpoint(ckpt, device="cpu").source_encoder()
    limits = [len(ids) for ids in encoder.to_ids(encoder.normalize(lines))]  # EOS included
    short = [i for i, limit in enumerate(limits) if limit < 12]
    assert 0 < len(short) < len(lines)  # the demo's sentences are on both sides of 12
    code, out, err = nmt_cli(
        "generate",
        f"checkpoint={ckpt}",
        f"input={src}",
        "device=cpu",
        "beam=2",
        "format=fairseq",
        "min_len=12",
        "max_len_a=1",
        "max_len_b=0",
    )
    assert code == 0, err
    hyps = [row.split("\t") for row in out.splitlines() if row.startswith("H-")]
    lengths = {int(h[0][2:]): len(h[2].split()) for h in hyps}  # pieces, EOS not shown
    assert sorted(lengths) == list(range(len(lines)))
    for i, limit in enumerate(limits):
        assert lengths[i] == limit if i in short else lengths[i] >= 12, (i, limit, lengths[i])
    assert f"min_len=12: {len(short)} sentence(s) (the first: line {short[0] + 1})" in err


# ------------------------------------------------------------------ output= is an input (item 11)


def test_an_output_that_is_an_input_is_refused_before_anything_is_written(
    nmt_cli, ckpt, demo_data_dir, tmp_path
):
    src = write_lines(tmp_path / "in.en", [line.encode() for line in demo_lines(3)])
    ref = write_lines(tmp_path / "ref.de", [b"eins", b"zwei", b"drei"])
    (tmp_path / "link.en").symlink_to(src.name)
    os.link(src, tmp_path / "hard.en")
    (tmp_path / "dir").mkdir()
    snapshot = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    ckpt_before = ckpt.read_bytes()
    cases = [
        (f"output={src}", "input="),
        (f"output={tmp_path / 'link.en'}", "input="),  # a symlink to it
        (f"output={tmp_path / 'hard.en'}", "input="),  # a hard link to it
        (f"output={tmp_path / 'dir' / '..' / 'in.en'}", "input="),
        (f"output={tmp_path / 'new' / '..' / 'in.en'}", "input="),  # a folder still to make
        (f"output={ref}", "ref="),
        (f"output={ckpt}", "checkpoint="),
    ]
    for output, names in cases:
        code, _, err = nmt_cli(
            "generate", *generate_args(ckpt, f"input={src}", f"ref={ref}", output)
        )
        one_line_error(code, err, "generate", f"{output}: is an input of this run", names)
    code, _, err = nmt_cli(
        "generate", *generate_args(ckpt, f"input={src}", f"prefix_file={ref}", f"output={ref}")
    )
    one_line_error(code, err, "generate", "is an input of this run (prefix_file=")
    # a data dir's own files, but a hypothesis file beside them is the user's to replace
    idx = demo_data_dir / "test.en.idx"
    idx_before = idx.read_bytes()
    code, _, err = nmt_cli(
        "generate", *generate_args(ckpt, f"input={demo_data_dir}", "split=test", f"output={idx}")
    )
    one_line_error(code, err, "generate", "is an input of this run (input=")
    assert idx.read_bytes() == idx_before and ckpt.read_bytes() == ckpt_before
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == snapshot
    assert not (tmp_path / "new").exists()


# ------------------------------------------------------------------ a terminal (item 11)


def test_a_terminal_as_stdin_gets_a_prompt(ckpt):
    """The console script on a real pseudo-terminal: a one-line prompt on stderr says it
    reads sentences until Ctrl-D; a typed line is translated, Ctrl-D ends the run."""
    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen(
            [str(BIN / "nmt-generate"), *generate_args(ckpt)],
            stdin=follower,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        os.close(follower)
        # the terminal's line discipline holds the typing until the program reads it
        os.write(leader, demo_lines(1)[0].encode() + b"\n")
        os.write(leader, b"\x04")  # Ctrl-D at the start of a line: end of input
        out, err = proc.communicate(timeout=300)
    finally:
        os.close(leader)
    assert proc.returncode == 0, err
    prompts = [line for line in err.splitlines() if PROMPT in line]
    assert prompts == [
        "nmt-generate: reading sentences from the terminal, one per line; Ctrl-D ends the input"
    ]
    assert len(out.splitlines()) == 1


# ------------------------------------------------------------------ kill -9 (item 11)


def test_kill_9_while_writing_the_output_keeps_the_previous_one(nmt_cli, ckpt, tmp_path):
    """nmt-generate killed with SIGKILL while it translates 400 lines into output=: the
    previous output stays whole (the new one appears only when complete), the killed run's
    temporary is left, and the same command run again removes it and writes everything."""
    src = write_lines(tmp_path / "in.en", [line.encode() for line in demo_lines(400, "train")])
    out = tmp_path / "out.de"
    out.write_text("the previous, complete translations\n", encoding="utf-8")
    before = out.read_bytes()
    args = [str(BIN / "nmt-generate"), *generate_args(ckpt, f"input={src}", f"output={out}")]
    args += ["max_len_b=30", "buffer_size=10"]  # slow enough, written as it goes
    with open(tmp_path / "stderr", "wb") as stderr:
        proc = subprocess.Popen(args, stderr=stderr)
        try:
            deadline = time.monotonic() + 300
            while not any(t.stat().st_size for t in stale_temps(out) if t.exists()):
                assert proc.poll() is None, "nmt-generate ended before it was killed"
                assert time.monotonic() < deadline, "no output written within 300 s"
                time.sleep(0.01)
            assert out.read_bytes() == before  # translations are being written, elsewhere
            assert proc.poll() is None
            proc.send_signal(signal.SIGKILL)
            assert proc.wait(timeout=60) == -signal.SIGKILL
        finally:
            proc.kill()
    assert out.read_bytes() == before
    assert len(stale_temps(out)) == 1
    rerun = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr
    assert stale_temps(out) == []
    expected = translations(nmt_cli, ckpt, src, "max_len_b=30")
    assert out.read_text(encoding="utf-8").splitlines() == expected
    assert len(expected) == 400


def test_a_second_run_leaves_a_live_writers_temporary_alone(tmp_path):
    """Two real processes: while one writes a file (nmt.fsutil.atomic_write), another run
    cleaning the stale temporaries of that file keeps the live one, so the first completes;
    once the writer is killed, its temporary is stale and goes."""
    target = tmp_path / "out.de"
    ready, go = tmp_path / "ready", tmp_path / "go"
    writer = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from nmt.fsutil import atomic_write
        with atomic_write({str(target)!r}) as f:
            f.write("the first run's translations\\n")
            f.flush()
            Path({str(ready)!r}).touch()
            while not Path({str(go)!r}).exists():
                time.sleep(0.01)
    """)
    cleaner = [
        sys.executable,
        "-c",
        f"from nmt.fsutil import remove_stale_temps; print(len(remove_stale_temps({str(target)!r})))",
    ]

    def start_writer() -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", writer])
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        ready.unlink()
        return proc

    first = start_writer()
    try:
        removed = subprocess.run(cleaner, capture_output=True, text=True, timeout=120)
        assert removed.stdout.strip() == "0" and len(stale_temps(target)) == 1
        go.touch()
        assert first.wait(timeout=120) == 0
    finally:
        first.kill()
    assert target.read_text() == "the first run's translations\n" and not stale_temps(target)
    go.unlink()
    killed = start_writer()
    killed.kill()
    killed.wait(timeout=60)
    removed = subprocess.run(cleaner, capture_output=True, text=True, timeout=120)
    assert removed.stdout.strip() == "1" and not stale_temps(target)


# ------------------------------------------------------------------ nmt-score


@pytest.fixture
def score_files(tmp_path) -> dict[str, Path]:
    ref = ["ein Mann fährt Fahrrad", "eine Frau liest", "zwei Hunde spielen", "ein Kind lacht"]
    hyp = ["ein Mann fährt Rad", "eine Frau liest ein Buch", "zwei Hunde", "ein Kind lacht"]
    return {
        "ref": write_lines(tmp_path / "ref.de", [r.encode() for r in ref]),
        "hyp": write_lines(tmp_path / "hyp.de", [h.encode() for h in hyp]),
        "bad": write_lines(
            tmp_path / "bad.de",
            [h.encode() for h in hyp[:2]] + [b"zwei Hunde \xe4"] + [hyp[3].encode()],
        ),
    }


def test_score_invalid_utf8_names_the_file_and_line(nmt_cli, score_files):
    f = score_files
    code, _, err = nmt_cli("score", f"hyp={f['bad']}", f"refs={f['ref']}")
    one_line_error(code, err, "score", f"{f['bad']}:3: invalid UTF-8", "input_errors=replace")
    code, _, err = nmt_cli("score", f"hyp={f['hyp']}", f"refs=[{f['ref']},{f['bad']}]")
    one_line_error(code, err, "score", f"{f['bad']}:3: invalid UTF-8")
    code, _, err = nmt_cli("score", f"hyp={f['hyp']}", f"refs={f['ref']}", f"baseline={f['bad']}")
    one_line_error(code, err, "score", f"{f['bad']}:3: invalid UTF-8")


def test_score_invalid_utf8_on_stdin_is_refused(score_files):
    """The console script on a real pipe (Python's stdin used to turn the bad byte into a
    lone surrogate and score it silently)."""
    run = subprocess.run(
        [str(BIN / "nmt-score"), "hyp=-", f"refs={score_files['ref']}"],
        input=score_files["bad"].read_bytes(),
        capture_output=True,
        timeout=300,
    )
    one_line_error(run.returncode, run.stderr.decode(), "score", "<stdin>:3: invalid UTF-8")
    assert run.stdout == b""


def test_score_replace_scores_the_replaced_text_and_counts_it(nmt_cli, score_files, tmp_path):
    f = score_files
    decoded = tmp_path / "decoded.de"
    decoded.write_text(f["bad"].read_bytes().decode("utf-8", errors="replace"), encoding="utf-8")
    code, out, err = nmt_cli(
        "score", f"hyp={f['bad']}", f"refs={f['ref']}", "input_errors=replace", "format=json"
    )
    assert code == 0, err
    assert f"{f['bad']}: 1 line had invalid UTF-8, replaced by U+FFFD (the first: line 3)" in err
    code, same, _ = nmt_cli("score", f"hyp={decoded}", f"refs={f['ref']}", "format=json")
    assert code == 0
    assert json.loads(out)["scores"] == json.loads(same)["scores"]


def test_score_output_that_is_an_input_is_refused(nmt_cli, score_files, tmp_path):
    f = score_files
    (tmp_path / "link.de").symlink_to(f["ref"].name)
    os.link(f["hyp"], tmp_path / "hard.de")
    snapshot = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    for output in (tmp_path / "link.de", tmp_path / "hard.de", tmp_path / "." / "ref.de"):
        code, _, err = nmt_cli("score", f"hyp={f['hyp']}", f"refs={f['ref']}", f"output={output}")
        one_line_error(code, err, "score", f"output={output}: is an input of this run")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == snapshot
