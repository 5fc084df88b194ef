"""nmt-export and nmt-import-fairseq as commands: they write what the library calls write
(API == CLI), and every mistake is one `nmt-<command>: error:` line with exit code 2 that
leaves existing files alone."""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from nmt.checkpoint import build_checkpoint, save_checkpoint
from nmt.model.config import ModelConfig
from nmt.model.transformer import Transformer
from tests.helpers import unigram_tokenizer

DEMO = Path(__file__).resolve().parents[2] / "data" / "demo"


def one_line_error(code: int, err: str, command: str, *needles: str) -> str:
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"nmt-{command}: error: ")
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A small random nmt model with a joint SentencePiece model, as a checkpoint file."""
    lines = []
    for lang in ("en", "de"):
        with open(DEMO / f"train.{lang}", encoding="utf-8") as f:
            lines += [next(f).strip() for _ in range(400)]
    tok = unigram_tokenizer(lines, 150, "demo lines")
    cfg = ModelConfig(
        embed_dim=16,
        ffn_dim=32,
        attention_heads=2,
        encoder_layers=1,
        decoder_layers=1,
        share_all_embeddings=True,
    )
    torch.manual_seed(0)
    model = Transformer(cfg, tok.vocab_size, tok.vocab_size)
    path = tmp_path_factory.mktemp("interop") / "model.pt"
    data = {
        "src_lang": "en",
        "tgt_lang": "de",
        "src_vocab_size": tok.vocab_size,
        "tgt_vocab_size": tok.vocab_size,
        "joint_vocab": True,
        "special_ids": {"bos": 0, "pad": 1, "eos": 2, "unk": 3},
        "normalization": {"nfkc": False},
    }
    save_checkpoint(
        build_checkpoint(
            model_state=model.state_dict(),
            model_config=asdict(cfg),
            data=data,
            src_tokenizer=tok.model_bytes,
            tgt_tokenizer=tok.model_bytes,
        ),
        path,
    )
    return path


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_nmt_export_writes_what_the_library_writes(nmt_cli, checkpoint, tmp_path):
    pytest.importorskip("ctranslate2")
    from nmt.interop.ctranslate2_export import export_ctranslate2

    code, _, err = nmt_cli(
        "export", f"checkpoint={checkpoint}", f"output_dir={tmp_path / 'cli'}", "quantization=int8"
    )
    assert code == 0, err
    assert err == f"wrote CTranslate2 model {tmp_path / 'cli'} (en->de, quantization int8) " + (
        f"from {checkpoint}\n"
    )
    export_ctranslate2(str(checkpoint), str(tmp_path / "api"), "int8")
    cli, api = _files(tmp_path / "cli"), _files(tmp_path / "api")
    assert {"model.bin", "config.json", "spm.model", "nmt_export.json"} <= cli.keys()
    assert cli == api


def test_nmt_export_refuses_an_existing_output_dir(nmt_cli, checkpoint, tmp_path):
    pytest.importorskip("ctranslate2")
    out = tmp_path / "ct2"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    for extra in ([], ["overwrite=true"]):  # not an export: never replaced
        code, _, err = nmt_cli("export", f"checkpoint={checkpoint}", f"output_dir={out}", *extra)
        one_line_error(
            code, err, "export", f"output_dir={out}: holds 1 file and is not an nmt-export"
        )
        assert (out / "mine.txt").read_text() == "keep"
    (out / "mine.txt").unlink()
    code, _, err = nmt_cli("export", f"checkpoint={checkpoint}", f"output_dir={out}")
    assert code == 0, err  # an empty directory is filled
    code, _, err = nmt_cli("export", f"checkpoint={checkpoint}", f"output_dir={out}")
    one_line_error(code, err, "export", f"output_dir={out}: an nmt-export directory already")
    code, _, err = nmt_cli(
        "export", f"checkpoint={checkpoint}", f"output_dir={out}", "overwrite=true"
    )
    assert code == 0, err
    assert (out / "model.bin").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ct2"]  # no temporaries or locks left


@pytest.mark.parametrize(
    "args, message",
    [
        (["output_dir=x"], "checkpoint=null: required; give the nmt checkpoint"),
        (["checkpoint=x.pt"], "output_dir=null: required; give the CTranslate2 model directory"),
        (
            ["checkpoint=x.pt", "output_dir=x", "quantization=int4"],
            "quantization=int4: unknown; use one of none, int8, int16, float16, bfloat16",
        ),
    ],
)
def test_nmt_export_config_mistakes(nmt_cli, tmp_path, args, message):
    code, _, err = nmt_cli("export", *args)
    one_line_error(code, err, "export", message)


class _RunsShell:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_nmt_import_fairseq_refuses_a_pickle_that_runs_code(nmt_cli, tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "checkpoint_evil.pt"
    torch.save({"model": {}, "x": _RunsShell(str(marker))}, path)
    code, _, err = nmt_cli(
        "import_fairseq", f"checkpoint={path}", f"spm={path}", f"output={tmp_path / 'o.pt'}"
    )
    one_line_error(code, err, "import-fairseq", "refusing to unpickle", str(path))
    assert not marker.exists() and not (tmp_path / "o.pt").exists()


def test_nmt_import_fairseq_keeps_an_existing_output(nmt_cli, tmp_path):
    out = tmp_path / "imported.pt"
    out.write_bytes(b"precious")
    for extra in ([], ["overwrite=true"]):  # not an import: never replaced
        code, _, err = nmt_cli(
            "import_fairseq",
            f"checkpoint={tmp_path / 'none.pt'}",
            "spm=j.model",
            f"output={out}",
            *extra,
        )
        one_line_error(
            code, err, "import-fairseq", f"output={out}: exists and is not an nmt checkpoint"
        )
        assert out.read_bytes() == b"precious"


@pytest.mark.parametrize(
    "args, message",
    [
        (["output=o.pt", "spm=j.model"], "checkpoint=null: required"),
        (["checkpoint=c.pt", "output=o.pt"], "spm=null: required; give the SentencePiece model"),
        (
            ["checkpoint=c.pt", "output=o.pt", "spm=j.model", "tgt_spm=t.model"],
            "spm=j.model: set together with src_spm/tgt_spm",
        ),
    ],
)
def test_nmt_import_fairseq_config_mistakes(nmt_cli, tmp_path, args, message):
    code, _, err = nmt_cli("import_fairseq", *args)
    one_line_error(code, err, "import-fairseq", message)
