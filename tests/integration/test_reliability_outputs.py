"""Issue 17, item 1 and the overwrite rule: a command replaces only what the same command
wrote before, never anything else, and the refusal says what is there.

Item 1 runs the console scripts in subprocesses, as the probe did; the other cases go
through the same `nmt.cli.main` in-process (`nmt_cli`: exit code and stderr), which is the
console scripts' whole code minus the interpreter start-up. The target is a real run dir of
nmt-train; afterwards it must be byte-identical (content, mode, inode: nothing rewritten,
nothing replaced by a copy).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_reliability_input import train_args

from nmt.checkpoint import load_checkpoint, save_checkpoint

BIN = Path(sys.executable).parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "NMT_DEBUG": ""}
HAS_CT2 = importlib.util.find_spec("ctranslate2") is not None


def nmt(command: str, *args: str) -> tuple[int, str, str]:
    proc = subprocess.run(
        [str(BIN / f"nmt-{command}"), *args],
        capture_output=True,
        text=True,
        env=ENV,
        stdin=subprocess.DEVNULL,
        timeout=300,
    )
    return proc.returncode, proc.stdout, proc.stderr


def one_line_error(code: int, err: str, command: str, *needles: str) -> str:
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, (code, err)
    assert lines[0].startswith(f"nmt-{command}: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def snapshot(root: Path) -> dict[str, tuple[str, int, int]]:
    """Every entry under `root`: (sha256 of a file's bytes or "dir", mode, inode)."""
    out = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        digest = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
        out[str(path.relative_to(root))] = (digest, st.st_mode, st.st_ino)
    return out


@pytest.fixture(scope="module")
def run_dir(demo_data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real run dir: numbered, last, best checkpoints, train.jsonl, tensorboard/, config."""
    from nmt.cli import main

    run = tmp_path_factory.mktemp("runs") / "run"
    main(
        "train",
        train_args(
            demo_data_dir,
            run,
            "max_update=4",
            "checkpoint.save_interval_updates=2",
            "validation.split=test",
            "validation.max_pairs=20",
            "logging.tensorboard=true",
        ),
    )
    names = {p.name for p in run.iterdir()}
    assert {"checkpoint_last.pt", "checkpoint_best.pt", "train.jsonl", "tensorboard"} <= names
    return run


def test_nmt_export_overwrite_never_deletes_a_run_dir(run_dir: Path) -> None:
    pytest.importorskip("ctranslate2")
    before = snapshot(run_dir)
    files = sum(1 for p in run_dir.rglob("*") if p.is_file())
    code, _, err = nmt(
        "export",
        f"checkpoint={run_dir / 'checkpoint_best.pt'}",
        f"output_dir={run_dir}",
        "overwrite=true",
    )
    one_line_error(
        code,
        err,
        "export",
        f"output_dir={run_dir}: holds {files} files and 1 folder and is not an nmt-export "
        "directory (no nmt_export.json); choose another output_dir",
    )
    assert snapshot(run_dir) == before
    assert sorted(p.name for p in run_dir.parent.iterdir()) == ["run"]  # no temporary, no lock


def test_nmt_preprocess_overwrite_never_deletes_a_run_dir(run_dir: Path, small_corpus) -> None:
    before = snapshot(run_dir)
    code, _, err = nmt(
        "preprocess",
        f"data.trainpref={small_corpus / 'train'}",
        "data.validpref=null",
        "data.testpref=[]",
        f"data.dest={run_dir}",
        "overwrite=true",
        "spm.vocab_size=200",
        "spm.byte_fallback=false",
    )
    one_line_error(
        code, err, "preprocess", f"data.dest={run_dir}: holds", "is not an nmt data dir (no meta"
    )
    assert snapshot(run_dir) == before
    assert sorted(p.name for p in run_dir.parent.iterdir()) == ["run"]


def test_no_command_writes_its_output_over_a_checkpoint(
    nmt_cli, run_dir: Path, small_corpus
) -> None:
    """nmt-average, nmt-import-fairseq (even with overwrite=true), nmt-generate and nmt-score
    given a training checkpoint as their output refuse, naming what is there."""
    best, numbered = run_dir / "checkpoint_best.pt", run_dir / "checkpoint_1_2.pt"
    before = snapshot(run_dir)
    code, _, err = nmt_cli("average", f"inputs={run_dir}", "num_last=2", f"output={best}")
    one_line_error(
        code, err, "average", f"output={best}: exists and is a training checkpoint (it holds"
    )
    code, _, err = nmt_cli(
        "import_fairseq", "checkpoint=fs.pt", "spm=spm.model", f"output={best}", "overwrite=true"
    )
    one_line_error(
        code, err, "import-fairseq", f"output={best}: exists and is a training checkpoint"
    )
    code, _, err = nmt_cli(
        "generate",
        f"checkpoint={run_dir / 'checkpoint_last.pt'}",
        f"input={small_corpus / 'test.en'}",
        f"output={best}",
    )
    one_line_error(code, err, "generate", f"output={best}: exists and holds binary data")
    code, _, err = nmt_cli(
        "score", f"hyp={small_corpus / 'test.de'}", f"refs={small_corpus / 'test.de'}",
        f"output={numbered}",
    )  # fmt: skip
    one_line_error(code, err, "score", f"output={numbered}: exists and holds binary data")
    code, _, err = nmt_cli("average", f"inputs={run_dir}", "num_last=2", f"output={run_dir}")
    one_line_error(code, err, "average", f"output={run_dir}: is a directory")
    assert snapshot(run_dir) == before


def test_each_command_replaces_its_own_earlier_output(
    nmt_cli, run_dir: Path, small_corpus, tmp_path: Path
) -> None:
    """The other half of the rule: what the same command wrote is replaced (with
    overwrite=true where the command has it), and the new output is complete."""
    out = tmp_path / "out"
    # nmt-average: a re-run replaces its own average, no option needed (fairseq's behaviour)
    avg = out / "avg.pt"
    for _ in range(2):
        code, _, err = nmt_cli("average", f"inputs={run_dir}", "num_last=2", f"output={avg}")
        assert code == 0, err
    assert "averaged_from" in load_checkpoint(avg)["config"]
    # nmt-import-fairseq: an earlier import is past the output check with overwrite=true
    # (it then fails on the missing fairseq checkpoint, which is all this needs)
    imported = out / "imported.pt"
    averaged = load_checkpoint(avg)
    save_checkpoint({**averaged, "config": {"imported_from": "fairseq"}}, imported)
    args = ["checkpoint=missing-fairseq.pt", "spm=spm.model", f"output={imported}"]
    code, _, err = nmt_cli("import_fairseq", *args)
    one_line_error(code, err, "import-fairseq", f"output={imported}: already exists", "overwrite")
    code, _, err = nmt_cli("import_fairseq", *args, "overwrite=true")
    one_line_error(code, err, "import-fairseq", "missing-fairseq.pt")
    # nmt-generate and nmt-score replace their own (text) outputs
    hyp, report = out / "hyp.de", out / "report.json"
    for _ in range(2):
        code, _, err = nmt_cli(
            "generate", f"checkpoint={avg}", f"input={small_corpus / 'test.en'}",
            f"output={hyp}", "beam=1", "max_len_b=3", "progress=false",
        )  # fmt: skip
        assert code == 0, err
        code, _, err = nmt_cli(
            "score", f"hyp={hyp}", f"refs={small_corpus / 'test.de'}", f"output={report}",
            "format=json",
        )  # fmt: skip
        assert code == 0, err
    assert len(hyp.read_text(encoding="utf-8").splitlines()) == 50
    if HAS_CT2:
        ct2 = out / "ct2"
        code, _, err = nmt_cli("export", f"checkpoint={avg}", f"output_dir={ct2}")
        assert code == 0, err
        code, _, err = nmt_cli("export", f"checkpoint={avg}", f"output_dir={ct2}")
        one_line_error(code, err, "export", "an nmt-export directory already exists there")
        first = snapshot(ct2)
        code, _, err = nmt_cli("export", f"checkpoint={avg}", f"output_dir={ct2}", "overwrite=true")
        assert code == 0, err
        assert snapshot(ct2).keys() == first.keys() and snapshot(ct2) != first  # new inodes
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # no temps, no locks


def test_overwrite_keeps_a_data_dir_or_export_that_holds_other_files(
    nmt_cli, run_dir: Path, preprocess_config, tmp_path: Path
) -> None:
    """A data dir (or an export) with a user's file in it is not replaced: overwrite=true
    would delete that file; the refusal names it."""
    from nmt.data import build_data_dir

    build_data_dir(preprocess_config())
    data = tmp_path / "out"
    (data / "notes.txt").write_text("mine")
    (data / "runs").mkdir()
    (data / "runs" / "checkpoint_last.pt").write_bytes(b"a run saved inside the data dir")
    before = snapshot(data)
    corpus = tmp_path / "corpus"
    code, _, err = nmt_cli(
        "preprocess",
        f"data.trainpref={corpus / 'train'}",
        f"data.validpref={corpus / 'valid'}",
        f"data.testpref=[{corpus / 'test'}]",
        f"data.dest={data}",
        "overwrite=true",
        "spm.vocab_size=200",
        "spm.byte_fallback=false",
    )
    one_line_error(
        code,
        err,
        "preprocess",
        f"data.dest={data}: an nmt data dir that also holds 2 other entries (notes.txt, "
        "runs/checkpoint_last.pt), which overwrite=true would delete; move them out",
    )
    assert snapshot(data) == before
    if HAS_CT2:
        ct2 = tmp_path / "ct2"
        best = run_dir / "checkpoint_best.pt"
        assert nmt_cli("export", f"checkpoint={best}", f"output_dir={ct2}")[0] == 0
        (ct2 / "README.md").write_text("how we deploy this model")
        before = snapshot(ct2)
        code, _, err = nmt_cli(
            "export", f"checkpoint={best}", f"output_dir={ct2}", "overwrite=true"
        )
        one_line_error(code, err, "export", "also holds 1 other entry (README.md)")
        assert snapshot(ct2) == before
