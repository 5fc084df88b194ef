"""nmt-preprocess as a command: configs/preprocess.yaml and overrides compose into the
PreprocessConfig a library user gets by default, and the command writes exactly the data
dir that `nmt.data.build_data_dir` writes (API == CLI)."""

from __future__ import annotations

from pathlib import Path

from nmt.cli import compose_config, to_dataclass
from nmt.data import build_data_dir
from nmt.data.config import PreprocessConfig


def compose_preprocess(overrides: list[str]) -> PreprocessConfig:
    return to_dataclass(compose_config("preprocess", overrides))


def test_default_config_and_overrides() -> None:
    cfg = compose_preprocess([])
    assert (cfg.data.trainpref, cfg.data.dest) == ("data/demo/train", "data-bin/demo")
    assert cfg.data.testpref == ["data/demo/test"]
    cfg = compose_preprocess(
        [
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
    assert compose_preprocess([]) == PreprocessConfig()
    overrides = ["clean.max_ratio=null", "data.testpref=[a/x,b/y]", "spm.model_type=unigram"]
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
