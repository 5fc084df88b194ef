"""Issue 17, items 10 and 11 (the command line and preprocessing's input): each mistake is
one line naming the key or file and saying what to do, with a non-zero exit, `--cfg` or not.

The console scripts run as subprocesses where the shell's view matters (non-ASCII
arguments); the matrices go through the same `nmt.cli.main` in-process (`nmt_cli`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
ENV = {**os.environ, "NMT_DEBUG": ""}

# one invalid setting per command: each fails its dataclass's validate()
INVALID = {
    "preprocess": ["workers=0"],
    "train": ["max_epoch=-1"],
    "average": ["inputs=run", "num_last=-1"],
    "generate": ["beam=0"],
    "score": ["hyp=h.txt", "refs=[r.txt]", "metrics=[bleu,nope]"],
    "export": ["checkpoint=c.pt", "output_dir=x", "quantization=int3"],
    "import_fairseq": ["checkpoint=c.pt", "output=o.pt"],
    "serve": ["port=-5"],
}


def _one_line(code: int, err: str, command: str) -> str:
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, (code, err)
    assert lines[0].startswith(f"nmt-{command.replace('_', '-')}: error: "), lines[0]
    return lines[0]


@pytest.mark.parametrize("command", sorted(INVALID))
def test_cfg_on_an_invalid_config_fails_as_the_command_would(nmt_cli, command: str) -> None:
    """`--cfg` (Hydra's `--cfg job|hydra|all` too) prints only a config that would run."""
    # an added key the command lacks is named first (the invalid value keeps a command
    # that would ignore the key from running)
    for invalid in (INVALID[command], [*INVALID[command], "+no_such_option=1"]):
        code, _, err = nmt_cli(command, *invalid)
        expected = _one_line(code, err, command)
        assert ("no_such_option=1: not an option" in expected) == ("+no_such_option=1" in invalid)
        for cfg in (["--cfg"], ["--cfg", "job"], ["--cfg", "hydra"], ["--cfg", "all"]):
            code, out, err = nmt_cli(command, *cfg, *invalid)
            assert (_one_line(code, err, command), out) == (expected, "")


@pytest.mark.parametrize(
    "command, override, expected",
    [
        ("preprocess", "+spm.vocab_sise=8000", "spm.vocab_sise=8000: not an option of "
         "nmt-preprocess; did you mean spm.vocab_size=8000? (nmt-preprocess --help lists every "
         "option)"),
        ("train", "+model.ffn_dimm=64", "model.ffn_dimm=64: not an option of nmt-train; did you "
         "mean model.ffn_dim=64?"),
        ("generate", "+beem=3", "beem=3: not an option of nmt-generate; did you mean beam=3?"),
        ("train", "+foo=1", "foo=1: not an option of nmt-train; remove it"),
    ],
)  # fmt: skip
def test_an_added_key_the_command_lacks_is_refused(
    nmt_cli, tmp_path, command, override, expected
) -> None:
    """Hydra's `+key=value` adds any key; nmt used to drop it silently and run (inputs that
    do not exist here keep such a run short)."""
    missing = {
        "preprocess": [f"data.trainpref={tmp_path / 'none'}", f"data.dest={tmp_path / 'd'}"],
        "train": [f"data={tmp_path / 'none'}", f"save_dir={tmp_path / 'run'}"],
        "generate": [f"checkpoint={tmp_path / 'none.pt'}"],
    }[command]
    code, _, err = nmt_cli(command, *missing, override)
    assert expected in _one_line(code, err, command)
    assert list(tmp_path.iterdir()) == []


def test_added_keys_that_the_schema_allows_still_work(nmt_cli, tmp_path) -> None:
    paths = ["data.trainpref=corpus/train", "data.dest=data-bin/x"]
    code, out, err = nmt_cli(
        "preprocess", "--cfg", *paths, f"+data.extra_train.clean={tmp_path / 'c'}"
    )
    assert code == 0 and f"clean: {tmp_path / 'c'}" in out, err
    code, out, err = nmt_cli("train", "--cfg", "data=d", "save_dir=r", "+experiment=multi30k")
    assert code == 0, err


# Hydra's grammar reads unquoted values of ASCII letters, digits, spaces and /-\+.$%*@?|:
# only (hydra/grammar/OverrideLexer.g4); everything else must be quoted
@pytest.mark.parametrize(
    "command, override, bad, quoted",
    [
        ("preprocess", "data.dest=données", "é", "data.dest='données'"),
        ("preprocess", "data.src=ü", "ü", "data.src='ü'"),
        ("preprocess", "data.testpref=[corpus/test,données/test2]", "é",
         "data.testpref=['corpus/test','données/test2']"),
        ("generate", "input=入力.txt", "入", "input='入力.txt'"),
        ("preprocess", "data.dest=~/data-bin/demo", "~", "data.dest='~/data-bin/demo'"),
        ("train", "save_dir=runs/#1", "#", "save_dir='runs/#1'"),
    ],
)  # fmt: skip
def test_an_unquoted_value_hydra_cannot_read_says_how_to_quote_it(
    nmt_cli, command: str, override: str, bad: str, quoted: str
) -> None:
    code, _, err = nmt_cli(command, override, "--cfg")
    assert _one_line(code, err, command) == (
        f"nmt-{command}: error: {override}: Hydra cannot read the character {bad!r} unquoted; "
        f'quote the value for Hydra and the whole for the shell: "{quoted}"'
    )
    # what the message says to type is what works (the shell removes the double quotes)
    required = {
        "preprocess": ["data.trainpref=corpus/train", "data.dest=data-bin/x"],
        "train": ["data=data-bin/x", "save_dir=runs/x"],
    }.get(command, [])
    key = quoted.split("=", 1)[0]
    others = [r for r in required if r.split("=", 1)[0] != key]
    code, out, err = nmt_cli(command, *others, quoted, "--cfg")
    assert code == 0, err
    value = quoted.split("=", 1)[1].replace("'", "")
    assert value.strip("[]").split(",")[-1] in out


def test_the_quoting_hint_through_the_console_script() -> None:
    """The same through a real shell: the probe's LexerNoViableAltException, then the fix."""
    script = BIN / "nmt-preprocess"
    proc = subprocess.run(
        f"{script} --cfg data.dest=données", shell=True, capture_output=True, text=True, env=ENV
    )
    assert _one_line(proc.returncode, proc.stderr, "preprocess").endswith(
        """quote the value for Hydra and the whole for the shell: "data.dest='données'\""""
    )
    proc = subprocess.run(
        f"{script} --cfg data.trainpref=corpus/train \"data.dest='données'\"", shell=True,
        capture_output=True, text=True,
        env=ENV,
    )  # fmt: skip
    assert proc.returncode == 0 and "dest: données" in proc.stdout, proc.stderr


def test_a_quoted_non_ascii_data_dest_is_built(nmt_cli, small_corpus: Path, tmp_path) -> None:
    dest = tmp_path / "données" / "démo"
    code, _, err = nmt_cli(
        "preprocess",
        f"data.trainpref={small_corpus / 'train'}",
        "data.validpref=null",
        "data.testpref=[]",
        f"data.dest='{dest}'",
        "spm.vocab_size=200",
        "spm.byte_fallback=false",
        "workers=1",
    )
    assert code == 0, err
    assert (dest / "meta.json").is_file()


def test_a_key_hydra_cannot_read(nmt_cli) -> None:
    code, _, err = nmt_cli("preprocess", "données=1")
    assert "données=1: not a KEY=VALUE override (the character 'é' cannot be in a key)" in (
        _one_line(code, err, "preprocess")
    )


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["spm.vocab_size=3"], "spm.vocab_size=3: too small: SentencePiece needs more than 260, "
         "as the 4 special pieces (<s> <pad> </s> <unk>) and the 256 byte pieces "
         "(spm.byte_fallback=true) come first; use about 1000"),
        (["spm.vocab_size=3", "spm.byte_fallback=false"], "spm.vocab_size=3: too small: "
         "SentencePiece needs more than 4, as the 4 special pieces (<s> <pad> </s> <unk>) come"),
        (["spm.vocab_size=6", "spm.byte_fallback=false", "spm.user_defined_symbols=['<a>','<b>']"],
         "needs more than 6, as the 4 special pieces (<s> <pad> </s> <unk>) and the 2 "
         "spm.user_defined_symbols come first"),
        # above the reserved pieces, below what the text needs: SentencePiece's count
        (["spm.vocab_size=10", "spm.byte_fallback=false"], "spm.vocab_size=10: "),
    ],
)  # fmt: skip
def test_a_vocab_size_sentencepiece_rejects_is_one_line(
    nmt_cli, small_corpus: Path, tmp_path: Path, overrides: list[str], expected: str
) -> None:
    """spm.vocab_size=3 used to give SentencePiece's raw `INTERNAL: ... insert_id(...)`."""
    code, _, err = nmt_cli(
        "preprocess",
        f"data.trainpref={small_corpus / 'train'}",
        "data.validpref=null",
        "data.testpref=[]",
        f"data.dest={tmp_path / 'out'}",
        "workers=1",
        *overrides,
    )
    line = _one_line(code, err, "preprocess")
    assert expected in line and "INTERNAL" not in line
    if overrides[0] == "spm.vocab_size=10":
        assert "needs at least" in line and "set spm.vocab_size=" in line
    assert not (tmp_path / "out").exists()


def test_a_directory_given_as_a_corpus_file_says_so(small_corpus: Path, tmp_path: Path) -> None:
    (small_corpus / "train.en").unlink()
    (small_corpus / "train.en").mkdir()  # e.g. an unpacked archive named like the file
    proc = subprocess.run(
        [
            str(BIN / "nmt-preprocess"),
            f"data.trainpref={small_corpus / 'train'}",
            f"data.dest={tmp_path / 'new' / 'out'}",
        ],
        capture_output=True,
        text=True,
        env=ENV,
    )
    line = _one_line(proc.returncode, proc.stderr, "preprocess")
    assert line == (
        f"nmt-preprocess: error: {small_corpus / 'train.en'}: is a directory; give the prefix "
        "of the text files"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus"]  # nothing made, no lock


# A process that "joins" a job with torch's init replaced (as test_gpu_path does), then
# runs nmt.cli.main, which fails (missing files) or succeeds (a hypothesis scored against
# itself), and says how it left (atexit: the normal way).
SIMULATED_JOB = """
import atexit, sys
from pathlib import Path
import torch
import torch.distributed as dist
from nmt import distributed
from nmt.cli import main

atexit.register(print, "normal exit", flush=True)
dist.init_process_group = lambda *args, **kwargs: None
distributed.init_process_group(distributed.DistEnv(0, 2, 0), torch.device("cpu"), 30.0)
Path("text.txt").write_text("a small test\\n")
main("score", sys.argv[1:])
"""


@pytest.mark.parametrize("succeeds", [False, True], ids=["error", "success"])
@pytest.mark.parametrize("world_size, teardown", [(None, True), ("2", False)])
def test_only_a_torchrun_rank_leaves_without_the_interpreters_teardown(
    tmp_path, world_size, teardown, succeeds
) -> None:
    """nmt.cli._exit: when its command ends, after an error or a success, a rank of a
    torchrun job (WORLD_SIZE > 1) leaves with os._exit and its exit code (gloo's threads
    could abort the teardown); a process that only simulated a job, as an in-process test
    does, exits normally, so a test runner is never ended."""
    env = {**ENV, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    env.pop("WORLD_SIZE", None)
    if world_size:
        env["WORLD_SIZE"] = world_size
    args = ["hyp=text.txt", "refs=[text.txt]"] if succeeds else ["hyp=no.txt", "refs=[no.txt]"]
    proc = subprocess.run(
        [sys.executable, "-c", SIMULATED_JOB, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    if succeeds:
        assert proc.returncode == 0 and "BLEU" in proc.stdout, proc.stderr
    else:
        _one_line(proc.returncode, proc.stderr, "score")
    assert ("normal exit" in proc.stdout) == teardown, proc.stdout
