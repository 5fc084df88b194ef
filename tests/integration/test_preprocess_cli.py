"""nmt-preprocess as a command: configs/preprocess.yaml and overrides compose into the
PreprocessConfig a library user gets by default, and the command writes exactly the data
dir that `nmt.data.build_data_dir` writes (API == CLI); on a terminal it shows progress
bars with the rate and the time left."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

from omegaconf import OmegaConf

from nmt.cli import compose_config, to_dataclass
from nmt.data import build_data_dir
from nmt.data.config import PreprocessConfig

PATHS = ["data.trainpref=corpus/train", "data.dest=data-bin/x"]  # required: no defaults


def compose_preprocess(overrides: list[str]) -> PreprocessConfig:
    return to_dataclass(compose_config("preprocess", overrides))


def test_default_config_and_overrides() -> None:
    cfg = compose_preprocess(PATHS)
    assert (cfg.data.trainpref, cfg.data.dest) == ("corpus/train", "data-bin/x")
    assert cfg.data.validpref is None and cfg.data.testpref == []
    cfg = compose_preprocess(
        [
            *PATHS,
            "data.src=de",
            "data.tgt=en",
            "spm.vocab_size=8000",
            "spm.model_type=unigram",
            "data.testpref=[a/x,b/y]",
        ]
    )
    assert (cfg.data.src, cfg.data.tgt, cfg.spm.vocab_size) == ("de", "en", 8000)
    assert cfg.spm.model_type.value == "unigram" and cfg.data.testpref == ["a/x", "b/y"]


def test_the_yaml_defaults_are_the_dataclass_defaults(overridden_preprocess_config) -> None:
    """So the conftest fixtures (dataclass defaults) preprocess as `nmt-preprocess` does."""
    assert OmegaConf.to_object(compose_config("preprocess", [])) == PreprocessConfig()
    overrides = [
        *PATHS,
        "clean.max_ratio=null",
        "data.testpref=[a/x,b/y]",
        "spm.model_type=unigram",
    ]
    assert compose_preprocess(overrides) == overridden_preprocess_config(overrides)


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_the_command_writes_what_the_library_writes(
    nmt_cli, preprocess_config, small_corpus: Path, tmp_path: Path
) -> None:
    args = [
        f"data.trainpref={small_corpus / 'train'}",
        f"data.validpref={small_corpus / 'valid'}",
        f"data.testpref=[{small_corpus / 'test'}]",
        f"data.dest={tmp_path / 'out'}",
        "spm.vocab_size=200",
        "spm.byte_fallback=false",
        "spm.num_threads=1",
        "workers=1",
    ]
    code, out, err = nmt_cli("preprocess", *args)
    assert code == 0, err
    cli = _files(tmp_path / "out")
    report = build_data_dir(preprocess_config("overwrite=true"))
    api = _files(tmp_path / "out")
    assert cli.keys() == api.keys() and "meta.json" in api
    for name in api:
        if name not in ("meta.json", "config.yaml"):  # they record overwrite=true
            assert cli[name] == api[name], name
    # the command prints the library's report, one line per split among them
    printed = out.splitlines()
    for line in report.lines():
        if not line.startswith(("encoded ", "training ")):  # timings differ
            assert any(p.endswith(line) for p in printed), line
    assert "nmt-preprocess: training a bpe SentencePiece model of 200 pieces" in out
    assert printed[-1] == f"nmt-preprocess: wrote {tmp_path / 'out'}"
    assert sum(p.startswith("  ") for p in printed) == len(report.meta.splits) == 3


def _stderr_on_a_terminal(argv: list[str]) -> tuple[int, str]:
    """Run a command with stderr on a pseudo-terminal of 120 columns (a real one: tqdm
    shows its bars only on a terminal); returns the exit code and what stderr showed.

    TQDM_MININTERVAL=0 (tqdm's environment default for its bars' option) makes every
    update print: with tqdm's 0.1 s a machine that encodes the 10,000 pairs faster than
    that showed only the bars' first, empty state (a Zen 5 EPYC did)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=slave,
        env={**os.environ, "TQDM_MININTERVAL": "0"},
    )
    os.close(slave)
    shown = bytearray()
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the command has closed the terminal
            break
        if not data:
            break
        shown += data
    os.close(master)
    return proc.wait(timeout=300), shown.decode("utf-8", "replace")


def test_progress_bars_show_the_rate_and_the_time_left_on_a_terminal(
    demo_corpus: Path, tmp_path: Path
) -> None:
    """On a terminal nmt-preprocess shows a bar while scanning (bytes) and one while
    encoding, with pairs/s and the time left; in a pipe or a log file, no bar."""
    command = Path(sys.executable).parent / "nmt-preprocess"
    args = [
        f"data.trainpref={demo_corpus / 'train'}",  # 10,000 pairs
        "data.validpref=null",
        "data.testpref=[]",
        "chunk_lines=200",
        "workers=1",
    ]
    code, shown = _stderr_on_a_terminal([str(command), *args, f"data.dest={tmp_path / 'a'}"])
    assert code == 0, shown
    updates = shown.replace("\r", "\n").splitlines()
    assert any(u.startswith("scanning:") and "B/s" in u for u in updates), shown
    # e.g. "encoding:  45%|████▌     | 4.50k/10.0k [00:00<00:00, 6.82k pairs/s, train]"
    timed = re.compile(r"^encoding: .*\| [\d.]+k?/10\.0k \[\d\d:\d\d<\d\d:\d\d, *[\d.]+k? pairs/s")
    assert any(timed.match(u) for u in updates), shown
    piped = subprocess.run(
        [str(command), *args, f"data.dest={tmp_path / 'b'}"], capture_output=True, text=True
    )
    assert piped.returncode == 0 and "encoding:" not in piped.stderr, piped.stderr
