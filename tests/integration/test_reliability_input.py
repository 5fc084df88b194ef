"""Reliability (issue 7), bad input: config mistakes, broken data dirs, unwritable outputs,
CRLF/BOM/empty files, and awkward generation input. Every mistake must end as exactly one
`nmt-<command>: error:` line naming the key or path, a non-zero exit, and no output file.

Cases already covered elsewhere (missing corpus files, line counts, invalid UTF-8, ref
length, overlong=error, ...) live in test_preprocess_errors.py, test_generate_cli.py and
test_score.py and are not repeated here.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
from pathlib import Path

import pytest
from helpers import run_training, tiny_config


def one_line_error(code: int, err: str, command: str, *needles: str) -> str:
    """The error contract: exit != 0, one stderr line, no traceback, naming every needle."""
    lines = err.strip().splitlines()
    assert code != 0
    assert len(lines) == 1, err
    assert lines[0].startswith(f"nmt-{command}: error: ") and "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def ckpt(demo_data_dir, tmp_path_factory) -> Path:
    """A tiny model trained for one update on the demo data dir (joint vocab)."""
    save_dir = tmp_path_factory.mktemp("reliability-run")
    run_training(tiny_config(demo_data_dir, save_dir, max_update=1))
    return save_dir / "checkpoint_last.pt"


def train_args(data: Path, save_dir: Path, *extra: str) -> list[str]:
    return [
        f"data={data}",
        f"save_dir={save_dir}",
        "train_split=valid",
        "validation.split=''",
        "max_tokens=500",
        "max_update=1",
        "threads=1",
        "device=cpu",
        "logging.tensorboard=false",
        "logging.progress_bar=false",
        "model.embed_dim=16",
        "model.ffn_dim=32",
        "model.attention_heads=2",
        "model.encoder_layers=1",
        "model.decoder_layers=1",
        *extra,
    ]


# ------------------------------------------------------------------ configuration


@pytest.mark.parametrize(
    "command, override, needle",
    [
        ("train", "no_such_key=1", "no_such_key"),
        ("train", "max_tokens=lots", "max_tokens"),
        ("train", "optim.lr=fast", "optim.lr"),
        ("generate", "beam=wide", "beam"),
        ("score", "metrics=7", "metrics"),
        ("preprocess", "spm.vocab_size=1.5", "spm.vocab_size"),
    ],
)
def test_unknown_keys_and_wrong_types_name_the_key(nmt_cli, tmp_path, command, override, needle):
    code, out, err = nmt_cli(command, override)
    one_line_error(code, err, command, needle)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["optim.lr=-0.001"], "optim.lr"),
        (["model.attention_heads=3"], "model.attention_heads"),
        (["max_tokens=1"], "max_tokens"),
        (["loss.label_smoothing=1.5"], "label_smoothing"),
    ],
)
def test_impossible_training_values_name_the_key(nmt_cli, demo_data_dir, tmp_path, extra, needle):
    code, _, err = nmt_cli("train", *train_args(demo_data_dir, tmp_path / "run", *extra))
    one_line_error(code, err, "train", needle)
    assert not (tmp_path / "run" / "checkpoint_last.pt").exists()


def test_share_all_embeddings_with_separate_vocabs(nmt_cli, preprocess_config, tmp_path):
    from nmt.data import build_data_dir

    cfg = preprocess_config("spm.joint=false")
    build_data_dir(cfg)
    code, _, err = nmt_cli(
        "train",
        *train_args(Path(cfg.data.dest), tmp_path / "run", "model.share_all_embeddings=true"),
    )
    one_line_error(code, err, "train", "model.share_all_embeddings")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "override, needle",
    [
        ("beam=0", "beam"),
        ("nbest=0", "nbest"),
        ("max_sentences=0", "max_sentences"),
        ("temperature=0", "temperature"),
    ],
)
def test_impossible_generation_values_name_the_key(nmt_cli, ckpt, tmp_path, override, needle):
    src = tmp_path / "in.en"
    src.write_text("a dog\n", encoding="utf-8")
    code, out, err = nmt_cli(
        "generate", f"checkpoint={ckpt}", f"input={src}", override, f"output={tmp_path / 'out.de'}"
    )
    one_line_error(code, err, "generate", needle)
    assert not (tmp_path / "out.de").exists()


# ------------------------------------------------------------------ data dirs and paths


def test_data_dir_without_meta_json(nmt_cli, demo_data_dir, tmp_path):
    broken = tmp_path / "data"
    shutil.copytree(demo_data_dir, broken)
    (broken / "meta.json").unlink()  # what an interrupted copy or a foreign folder looks like
    code, _, err = nmt_cli("train", *train_args(broken, tmp_path / "run"))
    one_line_error(code, err, "train", str(broken), "meta.json")
    code, _, err = nmt_cli(
        "generate", f"checkpoint={tmp_path / 'x.pt'}", f"input={broken}", "split=test"
    )
    assert code != 0 and len(err.strip().splitlines()) == 1


def test_data_dir_of_another_format_version(nmt_cli, demo_data_dir, ckpt, tmp_path):
    other = tmp_path / "data"
    shutil.copytree(demo_data_dir, other)
    meta = json.loads((other / "meta.json").read_text(encoding="utf-8"))
    meta["format_version"] = 99
    (other / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    code, _, err = nmt_cli("train", *train_args(other, tmp_path / "run"))
    one_line_error(code, err, "train", "meta.json", "format_version 99")
    code, _, err = nmt_cli(
        "generate", f"checkpoint={ckpt}", f"input={other}", "split=test", "device=cpu"
    )
    one_line_error(code, err, "generate", "format_version 99")


def test_directory_where_a_file_is_expected(nmt_cli, ckpt, tmp_path):
    code, _, err = nmt_cli("generate", f"checkpoint={tmp_path}", "input=-", "device=cpu")
    one_line_error(code, err, "generate", str(tmp_path))
    code, _, err = nmt_cli("score", f"hyp={tmp_path}", f"refs={tmp_path}")
    one_line_error(code, err, "score", str(tmp_path))


def test_unwritable_output_paths(nmt_cli, demo_data_dir, ckpt, small_corpus, tmp_path):
    """A regular file where a directory must be (chmod cannot stop root, this can)."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x", encoding="utf-8")
    src = tmp_path / "in.en"
    src.write_text("a dog\n", encoding="utf-8")
    code, _, err = nmt_cli(
        "generate",
        f"checkpoint={ckpt}",
        f"input={src}",
        "device=cpu",
        f"output={blocker / 'out.de'}",
    )
    one_line_error(code, err, "generate", str(blocker))
    code, _, err = nmt_cli("train", *train_args(demo_data_dir, blocker / "run"))
    one_line_error(code, err, "train", str(blocker))
    code, _, err = nmt_cli(
        "preprocess",
        f"data.trainpref={small_corpus / 'train'}",
        f"data.dest={blocker / 'data'}",
        "workers=1",
    )
    one_line_error(code, err, "preprocess", str(blocker))
    assert blocker.read_text(encoding="utf-8") == "x"


# ------------------------------------------------------------------ CRLF, BOM, empty files


def test_crlf_and_bom_are_normalized_in_generation(nmt_cli, ckpt, tmp_path):
    lines = ["a dog runs on the grass .", "two men are talking .", "", "a girl in a red coat ."]
    plain = tmp_path / "lf.en"
    plain.write_text("\n".join(lines) + "\n", encoding="utf-8")
    windows = tmp_path / "crlf.en"
    windows.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(lines).encode("utf-8") + b"\r\n")
    runs = [
        nmt_cli(
            "generate", f"checkpoint={ckpt}", f"input={p}", "device=cpu", "beam=2", "format=fairseq"
        )
        for p in (plain, windows)
    ]
    assert all(code == 0 for code, _, _ in runs)
    assert runs[0][1] == runs[1][1]  # the same S- (normalized source) and H- lines
    assert "\ufeff" not in runs[1][1] and "\r" not in runs[1][1]


def test_crlf_and_bom_in_scoring(nmt_cli, tmp_path):
    hyp, ref, ref_crlf = tmp_path / "hyp", tmp_path / "ref", tmp_path / "ref.crlf"
    hyp.write_text("the cat sat on the mat\na dog\n", encoding="utf-8")
    ref.write_text("the cat sat on a mat\na dog\n", encoding="utf-8")
    ref_crlf.write_bytes(b"\xef\xbb\xbfthe cat sat on a mat\r\na dog\r\n")
    a = nmt_cli("score", f"hyp={hyp}", f"refs={ref}", "format=json")
    b = nmt_cli("score", f"hyp={hyp}", f"refs={ref_crlf}", "format=json")
    assert a[0] == b[0] == 0
    assert json.loads(a[1])["scores"] == json.loads(b[1])["scores"]


def test_empty_generation_input_gives_empty_output(nmt_cli, ckpt, tmp_path):
    empty = tmp_path / "empty.en"
    empty.write_bytes(b"")
    out = tmp_path / "out.de"
    code, stdout, err = nmt_cli(
        "generate", f"checkpoint={ckpt}", f"input={empty}", "device=cpu", f"output={out}"
    )
    assert code == 0 and out.read_bytes() == b""
    assert "translated 0 sentences" in err and "Traceback" not in err


def test_empty_files_in_scoring(nmt_cli, tmp_path):
    empty, one = tmp_path / "empty", tmp_path / "one"
    empty.write_bytes(b"")
    one.write_text("a line\n", encoding="utf-8")
    code, _, err = nmt_cli("score", f"hyp={empty}", f"refs={one}")
    one_line_error(code, err, "score", str(empty), "empty")


# ------------------------------------------------------------------ awkward generation input


AWKWARD = [
    "",
    "a dog runs .",
    " ".join(["a very long sentence"] * 800),  # 3200 words: far past the positions
    "bell\x07 escape\x1b[31m nul\x00 tab\tdel\x7f",
    "一只狗在草地上奔跑。",  # Chinese: a script the tokenizer never saw
    "สุนัขวิ่งอยู่บนหญ้า",  # Thai
    "كلب يجري على العشب",  # Arabic, right to left
    "\u200b\u200d\ufeff zero widths \u2028 line separator \x0c form feed \x85 next line",
    "emoji 🐕🌱 and combining e\u0301",
    "   ",
]


# max_tokens=3 is smaller than most sentences: each then goes in a batch of its own
@pytest.mark.parametrize("fmt, max_tokens", [("plain", 0), ("fairseq", 3)])
def test_awkward_input_gives_one_output_per_line(nmt_cli, ckpt, tmp_path, fmt, max_tokens):
    src = tmp_path / "in.en"
    src.write_text("\n".join(AWKWARD) + "\n", encoding="utf-8")
    out = tmp_path / "out.de"
    code, _, err = nmt_cli(
        "generate",
        f"checkpoint={ckpt}",
        f"input={src}",
        "device=cpu",
        "beam=2",
        "max_len_b=8",
        f"format={fmt}",
        f"max_tokens={max_tokens}",
        f"output={out}",
    )
    assert code == 0, err
    assert "Traceback" not in err and "in.en:3" in err  # the long line is truncated, with a warning
    lines = out.read_text(encoding="utf-8").split("\n")
    assert lines[-1] == ""  # ends with a newline
    if fmt == "plain":
        assert len(lines) - 1 == len(AWKWARD)
    else:  # one H- and one D- line per input line, numbered in order
        ids = [line.split("\t")[0][2:] for line in lines if line.startswith("H-")]
        assert ids == [str(i) for i in range(len(AWKWARD))]


# ------------------------------------------------------------------ streaming


def test_text_input_is_consumed_lazily(ckpt, monkeypatch):
    """20k lines on stdin: the first chunk is ready after reading about one chunk of it."""
    import io

    from nmt.generation.io import SourceEncoder, text_lines, text_sources
    from nmt.generation.loading import load_for_inference

    reads = 0

    class CountingStdin(io.BytesIO):
        def readline(self, *args):  # noqa: ANN001, ANN202
            nonlocal reads
            reads += 1
            return super().readline(*args)

    data = b"".join(b"a dog number %d runs .\n" % i for i in range(20_000))
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(CountingStdin(data)))
    bundle = load_for_inference(ckpt)
    encoder = SourceEncoder(bundle.src_tokenizer, False, 1024, "truncate", "stdin")
    chunks = text_sources(text_lines("-", "input", "strict"), encoder, chunk=100)
    first = next(chunks)
    assert len(first) == 100 and reads <= 101
    assert sum(len(c) for c in chunks) == 20_000 - 100


def test_piped_generation_answers_before_the_input_ends(ckpt, monkeypatch):
    """nmt-generate reading a pipe prints line i's translation while the pipe is still open
    (run in a thread on real OS pipes: a subprocess would cost seconds of start-up)."""
    import select

    from nmt.cli import main

    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    monkeypatch.setattr(sys, "stdin", os.fdopen(in_r, "r", encoding="utf-8"))
    their_stdout = os.fdopen(out_w, "w", encoding="utf-8")
    monkeypatch.setattr(sys, "stdout", their_stdout)
    feed, answers = os.fdopen(in_w, "w", encoding="utf-8"), os.fdopen(out_r, "r", encoding="utf-8")
    failures: list[BaseException] = []

    def generate() -> None:
        try:
            main(
                "generate",
                [f"checkpoint={ckpt}", "device=cpu", "threads=1", "beam=1", "max_len_b=5"],
            )
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            failures.append(exc)
        finally:
            their_stdout.close()  # our reads end instead of waiting forever

    thread = threading.Thread(target=generate, daemon=True)
    thread.start()
    try:
        for i in range(3):
            feed.write(f"a dog number {i} runs .\n")
            feed.flush()
            ready, _, _ = select.select([answers], [], [], 60)
            assert ready, f"no translation of line {i + 1} within 60 s while the pipe is open"
            assert answers.readline().endswith("\n")
        feed.write("\n")  # an empty line: an empty translation, still one line
        feed.close()
        thread.join(timeout=60)
        assert not thread.is_alive() and not failures, failures
        assert answers.read() == "\n"
    finally:
        answers.close()
        if not feed.closed:
            feed.close()


# ------------------------------------------------------------------ permissions


def _deny_reading(monkeypatch, denied: Path) -> None:
    """Make opening `denied` fail as a file without read permission does (the tests run as
    root, which chmod cannot stop)."""
    import builtins
    import io

    real_open = builtins.open

    def guarded(file, *args, **kwargs):
        if isinstance(file, (str, os.PathLike)) and Path(file) == denied:
            raise PermissionError(13, "Permission denied", str(denied))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", guarded)
    monkeypatch.setattr(io, "open", guarded)


def test_an_unreadable_corpus_file_is_one_line_naming_it(
    nmt_cli, small_corpus, tmp_path, monkeypatch
):
    denied = small_corpus / "train.de"
    _deny_reading(monkeypatch, denied)
    code, _, err = nmt_cli(
        "preprocess",
        f"data.trainpref={small_corpus / 'train'}",
        f"data.validpref={small_corpus / 'valid'}",
        "data.testpref=[]",
        f"data.dest={tmp_path / 'out'}",
        "spm.vocab_size=200",
        "spm.byte_fallback=false",
        "workers=1",
    )
    one_line_error(code, err, "preprocess", str(denied), "Permission denied")
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file whatever its mode")
def test_a_chmod_000_corpus_file_is_one_line_naming_it(nmt_cli, small_corpus, tmp_path):
    denied = small_corpus / "train.de"
    denied.chmod(0)
    code, _, err = nmt_cli(
        "preprocess",
        f"data.trainpref={small_corpus / 'train'}",
        f"data.validpref={small_corpus / 'valid'}",
        "data.testpref=[]",
        f"data.dest={tmp_path / 'out'}",
        "spm.vocab_size=200",
        "spm.byte_fallback=false",
        "workers=1",
    )
    one_line_error(code, err, "preprocess", str(denied))
    assert not (tmp_path / "out").exists()
