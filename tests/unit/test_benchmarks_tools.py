"""benchmarks.make_corpus, benchmarks.scale and benchmarks.serve on benchmarks.common: the one
JSON schema, one-line errors for bad arguments, and their tables."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks import common, make_corpus, scale, serve


def test_make_corpus_writes_the_corpus_and_the_common_report(tmp_path, capsys):
    out = tmp_path / "report.json"
    prefix = tmp_path / "corpus" / "train"  # the folder is made
    argv = ["--pairs", "50", "--out", str(prefix), "--json", str(out)]
    assert make_corpus.main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["schema"] == common.SCHEMA and doc["name"] == "make_corpus"
    assert doc["command"].startswith("python -m benchmarks.make_corpus --pairs 50")
    assert doc["figures"]["pairs"] == 50
    src, tgt = (tmp_path / "corpus" / "train.en"), (tmp_path / "corpus" / "train.de")
    assert doc["figures"]["paths"] == [str(src), str(tgt)]
    assert len(src.read_text().splitlines()) == len(tgt.read_text().splitlines()) == 50
    assert "wrote" in capsys.readouterr().out


def test_make_corpus_is_seeded_and_a_prefix_of_any_larger_one(tmp_path, monkeypatch):
    """The same seed gives the same bytes, another seed other text, and the first N pairs
    of a larger corpus are the corpus of N pairs, across block boundaries (small blocks
    here, so that a few thousand pairs cross several)."""
    monkeypatch.setattr(make_corpus, "BLOCK", 1000)

    def corpus(name: str, pairs: int, seed: int = 1) -> list[bytes]:
        paths = make_corpus.write_corpus(tmp_path / name, pairs, seed=seed)
        return [p.read_bytes() for p in paths]

    small, again, large = corpus("a", 2500), corpus("b", 2500), corpus("c", 3700)
    assert small == again
    for mine, longer in zip(small, large):
        assert len(mine.split(b"\n")) == 2501
        assert longer.startswith(mine)
    other = corpus("d", 2500, seed=2)
    assert all(a != b for a, b in zip(small, other))


def test_make_corpus_lengths_are_like_bitext(tmp_path):
    """About 21 words a sentence (log-normal, at most 200), target lengths that follow the
    source's, and the few empty or unbalanced pairs that preprocessing's cleaning removes."""
    src, tgt = make_corpus.write_corpus(tmp_path / "c", 20_000, seed=3)
    src_words = np.array([len(line.split()) for line in src.read_text().splitlines()])
    tgt_words = np.array([len(line.split()) for line in tgt.read_text().splitlines()])
    assert len(src_words) == len(tgt_words) == 20_000
    assert 20.0 < src_words.mean() < 22.0  # 21 +- 0.1 (std of the mean) by construction
    assert src_words.min() >= 1 and src_words.max() <= 200 and np.median(src_words) < 21
    assert np.corrcoef(src_words, tgt_words)[0, 1] > 0.8
    empty = tgt_words == 0  # 0.1% of pairs: 20 expected
    unbalanced = tgt_words > 2.5 * src_words  # 0.2% of pairs have 4x the length: 40 expected
    assert 5 <= empty.sum() <= 60 and 10 <= unbalanced.sum() <= 100


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--pairs", "-1", "--out", "x"], "argument --pairs: -1 must be 0 or more"),
        (["--pairs", "5", "--out", "x", "--tgt", "en"], "--tgt en: the same as --src"),
    ],
)
def test_make_corpus_bad_arguments_in_one_line(argv, message, capsys):
    try:
        code = make_corpus.main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    assert code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("benchmarks.make_corpus: error: ") and message in last


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--sizes", "0"], "argument --sizes: 0 must be 1 or more"),
        (["--sizes", "10", "--fairseq-preprocess", "/no/such/fairseq-preprocess"], "no such"),
    ],
)
def test_scale_bad_arguments_in_one_line(argv, message, capsys):
    try:
        code = scale.main(argv)
    except SystemExit as exc:
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith("benchmarks.scale: error: ") and message in err
    assert "Traceback" not in err


def test_scale_table_has_a_row_per_step():
    figures = {
        "sizes": [
            {
                "pairs": 1000,
                "preprocess": {"wall_s": 2.0, "pairs_per_s": 500.0, "cpu_s": 3.0}
                | {"rss_gib": 0.1, "child_rss_gib": 0.05},
                "train_data": {"data_s": 0.2, "rss_gib": 0.01},
                "train": {"to_first_update_s": 4.0, "first_update_end_s": 5.5, "cpu_s": 6.0}
                | {"rss_gib": 0.5, "child_rss_gib": 0.0},
            }
        ]
    }
    lines = scale.table(figures).splitlines()
    assert len(lines) == 2 + 3
    assert lines[2].startswith("| 1,000 | nmt-preprocess | 2.0 | 500 | 3 |")
    assert "| 4.0 (5.5) |" in lines[4]
    assert all(line.count("|") == lines[0].count("|") for line in lines)


def test_serve_parses_its_command_line_and_refuses_bad_levels(tmp_path, capsys):
    ckpt, text = tmp_path / "model.pt", tmp_path / "input.txt"
    ckpt.write_bytes(b"")
    text.write_text("a\n")
    argv = ["--checkpoint", str(ckpt), "--input", str(text), "--threads", "1", "--rounds", "3"]
    args = serve.build_parser().parse_args(argv)
    assert (args.clients, args.rounds, args.threads, args.json) == ([1, 8, 32], 3, 1, None)
    with pytest.raises(SystemExit) as exc:
        serve.build_parser().parse_args([*argv, "--clients", "1,0"])
    assert exc.value.code == 2
    assert "benchmarks.serve: error: argument --clients: 1,0: each level" in capsys.readouterr().err


def test_serve_without_httpx_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_httpx(name, *args, **kwargs):
        if name == "httpx":
            raise ImportError("no httpx")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_httpx)
    ckpt, text = tmp_path / "model.pt", tmp_path / "input.txt"
    ckpt.write_bytes(b"")
    text.write_text("a\n")
    assert serve.main(["--checkpoint", str(ckpt), "--input", str(text)]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (
        "benchmarks.serve: error: httpx is not installed; pip install httpx "
        "(or the test extra: pip install -e '.[test]')"
    )


def test_serve_report_renders_one_table_row_per_level():
    level = {"clients": 8, "sentences_per_s": 40.0, "x_offline": 0.9, "p50_ms": 12.0}
    level |= {"p99_ms": 30.0, "mean_batch": 6.5, "ceiling_x_offline": 1.1}
    level |= {"server_cpu_ms": 20.0, "client_cpu_ms": 1.0}
    results = {"sentences": 100, "machine": "m", "date": "d", "rounds": 3}
    results |= {"offline_sentences_per_s": 44.0, "offline_cpu_ms": 18.0}
    results |= {"server_1_client_p50_ms": 11.0, "direct_p50_ms": 10.0, "latency_ratio": 1.1}
    results["levels"] = [level]
    lines = serve.report(results).splitlines()
    assert lines[-1] == "| 8 | 40.0 | 0.90 | 12.0 | 30.0 | 6.5 | 1.10 | 20.0 (+ 1.0) |"
    assert lines[-3].startswith("| clients | sentences/s | x offline |")
