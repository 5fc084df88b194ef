"""The benchmark modules, run in-process on tiny shapes: each one's figures, its JSON report,
its one-line errors, and the invariants the paired ones rely on (an A/A run computes the
same updates and translations on both sides; the adapters drive the API of f3ffaaf, the
revision before issue 16, to the same results as the current one)."""

from __future__ import annotations

import ast
import importlib
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import torch

from benchmarks import common

MODULES = [
    "suite",
    "preprocess",
    "train",
    "generate",
    "decoder",
    "ctranslate2",
    "fairseq_generate",
    "train_paired",
    "constraints",
    "generate_paired",
    "scale",
    "serve",
    "serve_memory",
    "make_corpus",
    "checkpoint_save",
]
DEMO = common.REPO / "data" / "demo"
BEFORE_ISSUE_16 = "f3ffaaf"  # old APIs: Trainer(cfg)._train_step, nmt.commands.generate.Translator
BEFORE_SECTIONS = "63aba36"  # TrainConfig's flat keys (valid_split=, ...), Trainer.train_step
TINY_TRAIN = [
    "--model",
    "transformer_tiny",
    "--set",
    "model.embed_dim=32",
    "--set",
    "model.ffn_dim=64",
    "--set",
    "model.encoder_layers=1",
    "--set",
    "model.decoder_layers=1",
    "--set",
    "train_split=valid",
    "--max-tokens",
    "300",
    "--threads",
    "1",
]


@pytest.fixture(autouse=True)
def keep_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def bench(name: str, argv: list[str], tmp_path: Path) -> dict:
    """Run benchmarks.<name> in-process with --json; its report."""
    module = importlib.import_module(f"benchmarks.{name}")
    out = tmp_path / f"{name}.json"
    code = common.main(name, module.build_parser, module.run, [*argv, "--json", str(out)])
    assert code == 0
    doc = json.loads(out.read_text())
    assert doc["name"] == name and doc["schema"] == common.SCHEMA
    return doc["figures"]


def has_revision(rev: str) -> bool:
    done = subprocess.run(
        ["git", "-C", str(common.REPO), "cat-file", "-e", f"{rev}^{{commit}}"],
        capture_output=True,
    )
    return done.returncode == 0


needs_old_revision = pytest.mark.skipif(
    not has_revision(BEFORE_ISSUE_16), reason=f"{BEFORE_ISSUE_16} is not in this clone's history"
)


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory, demo_data_dir) -> Path:
    """A random transformer_tiny over the demo vocabulary that never ends a sentence early."""
    from benchmarks.ctranslate2 import random_checkpoint

    out = tmp_path_factory.mktemp("bench-model") / "tiny.pt"
    return random_checkpoint("tiny", demo_data_dir / "spm.model", out)


def breakdown_line(out: str, label: str) -> list[tuple[str, float]]:
    """The parts and seconds of the line `# {label}: ... wall under the profiler: ...` that
    common.print_profile printed, checked to be time_breakdown's four parts in order."""
    line = next(x for x in out.splitlines() if x.startswith(f"# {label}: "))
    parts = re.findall(r"([a-zA-Z ,]+) (\d+\.\d+) s \((\d+)%\)", line.split("profiler: ")[1])
    names = [name.strip(" ,") for name, _, _ in parts]
    assert names == [
        "matrix products",
        "attention",
        "other operators",
        "Python, dispatch, profiler",
    ]
    return [(name, float(seconds)) for name, (_, seconds, _) in zip(names, parts)]


@pytest.mark.parametrize("name", MODULES)
def test_every_benchmark_is_a_module_with_help_and_json(name, capsys):
    module = importlib.import_module(f"benchmarks.{name}")
    with pytest.raises(SystemExit) as exc:
        module.build_parser().parse_args(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert f"usage: benchmarks.{name}" in out and "--json FILE" in out


def test_every_module_of_the_package_is_a_benchmark_run_by_common_main():
    names = {p.stem for p in (common.REPO / "benchmarks").glob("*.py")} - {"__init__", "common"}
    assert names == set(MODULES)
    for name in MODULES:
        source = (common.REPO / "benchmarks" / f"{name}.py").read_text()
        assert 'if __name__ == "__main__":' in source and "common.main(" in source, name


def test_no_sys_path_tweaks_in_the_benchmarks_or_scripts():
    files = sorted((common.REPO / "benchmarks").glob("*.py"))
    files += sorted((common.REPO / "scripts").glob("*.py"))
    offenders = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "path"
                and isinstance(node.value, ast.Name)
                and node.value.id == "sys"
            ):
                offenders.append(f"{path.name}:{node.lineno}")
    assert not offenders
    assert not list((common.REPO / "scripts").glob("bench*.py"))
    assert not (common.REPO / "scripts" / "paired_revision.py").exists()


def test_train_interleaved_keeps_each_precision_loss_curve_of_a_run_alone(demo_data_dir, tmp_path):
    args = ["--data", str(demo_data_dir), *TINY_TRAIN, "--updates", "4", "--warmup", "2"]
    args += ["--log-interval", "2", "--peak-seconds", "0"]
    figures = bench("train", [*args, "--precisions", "fp32", "bf16"], tmp_path)
    fp32, bf16 = figures["results"]
    assert (fp32["precision"], bf16["precision"]) == ("fp32", "bf16")
    assert fp32["intervals"] == bf16["intervals"] == 1
    assert fp32["tok_s"] > 0 and fp32["flop_s"] > 0 and fp32["matmul_peak_flop_s"] is None
    assert [u for u, _ in fp32["losses"]] == [u for u, _ in bf16["losses"]] == [2, 4]
    assert bf16["ratio_to_first"]["turns"] == 1
    alone = bench("train", [*args, "--precisions", "fp32", "--sequential"], tmp_path)
    assert alone["results"][0]["losses"] == fp32["losses"]


def test_train_profile_prints_where_a_step_s_time_goes_after_the_timed_intervals(
    demo_data_dir, tmp_path, capsys
):
    args = ["--data", str(demo_data_dir), *TINY_TRAIN, "--updates", "4", "--warmup", "2"]
    args += ["--log-interval", "2", "--peak-seconds", "0", "--precisions", "fp32"]
    plain = bench("train", args, tmp_path)["results"][0]
    capsys.readouterr()
    profiled = bench("train", [*args, "--profile"], tmp_path)["results"][0]
    assert breakdown_line(capsys.readouterr().out, "fp32, 2 updates")[0][1] > 0  # products
    profile = profiled["profile"]
    assert profile["matrix products"] > 0 and profile["operator calls"] > 0
    # the profiled interval is the next one: the timed ones, and their losses, are unchanged
    assert profiled["intervals"] == plain["intervals"] == 1
    assert profiled["losses"][:2] == plain["losses"]
    assert [update for update, _ in profiled["losses"]] == [2, 4, 6]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--updates", "4", "--warmup", "3", "--log-interval", "2"], "--warmup 3: must be"),
        (["--updates", "100000"], "--updates 100000: the data dir's first epoch has only"),
        (["--precisions", "fp32", "fp32"], "each at most once"),
        (["--profile", "--sequential"], "--profile: profiles the CPU's operators"),
    ],
)
def test_train_refuses_bad_arguments_in_one_line(demo_data_dir, argv, message, capsys):
    from benchmarks import train

    argv = ["--data", str(demo_data_dir), *TINY_TRAIN, "--peak-seconds", "0", *argv]
    assert common.main("train", train.build_parser, train.run, argv) == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]  # after the trainers' notes, when they were built
    assert last.startswith("benchmarks.train: error: ") and message in last
    assert "Traceback" not in err


def test_train_needs_a_data_dir(tmp_path, capsys):
    from benchmarks import train

    with pytest.raises(SystemExit) as exc:
        common.main("train", train.build_parser, train.run, ["--data", str(tmp_path)])
    assert exc.value.code == 2
    assert "not a data dir (no meta.json)" in capsys.readouterr().err


def test_generate_cached_and_uncached_produce_the_same_tokens(tiny_checkpoint, tmp_path):
    argv = ["--checkpoint", str(tiny_checkpoint), "--input", str(DEMO / "test.en")]
    argv += ["--lines", "12", "--beam", "2", "--batch", "4", "--threads", "1"]
    figures = bench("generate", [*argv, "--max-len-a", "0", "--max-len-b", "4"], tmp_path)
    cached, uncached = figures["cached"], figures["uncached"]
    assert cached["sentences"] == uncached["sentences"] == 12
    assert cached["tokens"] == uncached["tokens"] == 12 * 5  # 4 pieces + EOS, never earlier
    assert cached["sent_s"] > 0 and figures["kv_cache_speedup_wall"] > 0
    assert figures["reference_tokens_per_sentence"] > 1


def test_generate_on_a_device_this_machine_lacks_says_so(tiny_checkpoint, capsys, monkeypatch):
    from benchmarks import generate

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    argv = ["--checkpoint", str(tiny_checkpoint), "--input", str(DEMO / "test.en")]
    assert (
        common.main("generate", generate.build_parser, generate.run, [*argv, "--device", "cuda"])
        == 2
    )
    assert "--device=cuda: no CUDA device is available" in capsys.readouterr().err


def test_generate_paired_a_a_translates_alike(tiny_checkpoint, tmp_path):
    argv = ["--checkpoint", str(tiny_checkpoint), "--before", "HEAD", "--input"]
    argv += [str(DEMO / "test.en"), "--lines", "12", "--batch", "4", "--beam", "2"]
    figures = bench("generate_paired", [*argv, "--max-len-a", "0", "--max-len-b", "3"], tmp_path)
    assert figures["identical_translations"] == figures["sentences"] == 12
    for metric in ("wall", "cpu"):
        ratio = figures["after_over_before"][metric]
        assert ratio["turns"] == 2 * 3 and ratio["low"] <= ratio["ratio"] <= ratio["high"]


@needs_old_revision
def test_translator_adapters_drive_the_old_and_the_current_api_alike(tiny_checkpoint):
    from benchmarks.generate import source_ids
    from nmt.generation.translator import Translator

    old = common.import_revision(BEFORE_ISSUE_16).__name__
    encoder = Translator.from_checkpoint(tiny_checkpoint, device="cpu")
    sources = source_ids(encoder, str(DEMO / "test.en"), 10)
    options = dict(beam=3, max_len_a=0.0, max_len_b=5, max_sentences=4)
    before = common.translator_of(old, tiny_checkpoint, **options)(sources)
    after = common.translator_of("nmt", tiny_checkpoint, **options)(sources)
    assert before == after and len(after) == 10 and all(len(t) == 6 for t in after)


def test_train_paired_a_a_computes_the_same_updates_on_both_sides(demo_data_dir, tmp_path):
    argv = ["--data", str(demo_data_dir), "--before", "HEAD", *TINY_TRAIN]
    argv += ["--chunk", "1", "--turns", "4", "--warmup-turns", "0"]
    figures = bench("train_paired", argv, tmp_path)
    loss = figures["mean_loss"]
    assert loss["before/fp32"] == loss["after/fp32"] and loss["before/bf16"] == loss["after/bf16"]
    assert set(figures["ratios"]) >= {"fp32 after/before", "bf16 after/before"}
    for pair in figures["ratios"].values():
        assert pair["wall"]["turns"] == pair["cpu"]["turns"] == 4
    assert len(figures["per_turn"]["after/bf16"]) == 4


@needs_old_revision
def test_train_paired_drives_the_trainer_of_f3ffaaf(demo_data_dir, tmp_path):
    argv = ["--data", str(demo_data_dir), "--before", BEFORE_ISSUE_16, *TINY_TRAIN]
    argv += ["--precisions", "fp32", "--chunk", "1", "--turns", "2", "--warmup-turns", "0"]
    figures = bench("train_paired", argv, tmp_path)
    loss = figures["mean_loss"]
    assert loss["before/fp32"] == pytest.approx(loss["after/fp32"], rel=1e-6)
    assert figures["before"] == common.revision_id(BEFORE_ISSUE_16)


@pytest.mark.skipif(not has_revision(BEFORE_SECTIONS), reason=f"{BEFORE_SECTIONS} not in history")
def test_train_paired_against_the_flat_config_computes_the_same_updates(demo_data_dir, tmp_path):
    """The sectioned TrainConfig and the Trainer's functions train exactly as 0.1's flat
    config and methods did: the same loss to the bit (the overrides are renamed for it)."""
    argv = ["--data", str(demo_data_dir), "--before", BEFORE_SECTIONS, *TINY_TRAIN]
    argv += ["--precisions", "fp32", "--chunk", "1", "--turns", "2", "--warmup-turns", "0"]
    figures = bench("train_paired", argv, tmp_path)
    loss = figures["mean_loss"]
    assert loss["before/fp32"] == loss["after/fp32"]
    assert figures["before"] == common.revision_id(BEFORE_SECTIONS)


def test_train_paired_wants_whole_cycles_of_turns(demo_data_dir, capsys):
    from benchmarks import train_paired

    argv = ["--data", str(demo_data_dir), "--before", "none", "--turns", "3"]
    assert common.main("train_paired", train_paired.build_parser, train_paired.run, argv) == 2
    assert "must be multiples of 2" in capsys.readouterr().err


def test_preprocess_times_encoding_and_keeps_the_data_dir(tmp_path):
    from benchmarks import preprocess

    raw = tmp_path / "raw"
    raw.mkdir()
    names = {"train": "train", "val": "valid", "test_2016_flickr": "test"}
    for name, demo in names.items():
        for lang in ("en", "de"):
            lines = (DEMO / f"{demo}.{lang}").read_text(encoding="utf-8").splitlines()
            (raw / f"{name}.{lang}").write_text("\n".join(lines[:300]) + "\n", encoding="utf-8")
    keep = tmp_path / "kept"
    argv = ["--data", str(raw), "--workers", "1", "--repeats", "2", "--vocab-size", "350"]
    figures = bench("preprocess", [*argv, "--keep", str(keep)], tmp_path)
    assert figures["pairs"] == 900 and figures["seconds"]["n"] == 2
    assert figures["pairs_s"] > 0 and figures["pairs_per_cpu_s"] > 0
    assert (keep / "meta.json").is_file() and (keep / "spm.model").is_file()
    assert preprocess.build_multi30k(raw, keep) == keep  # an existing data dir is kept


def test_preprocess_names_a_folder_without_multi30k(tmp_path, capsys):
    from benchmarks import preprocess

    argv = ["--data", str(tmp_path)]
    assert common.main("preprocess", preprocess.build_parser, preprocess.run, argv) == 2
    assert "no train.en; name a folder with Multi30k" in capsys.readouterr().err


def test_checkpoint_save_times_one_name_against_four_independent_files(tmp_path, capsys):
    from benchmarks import checkpoint_save

    out = tmp_path / "report.json"
    argv = ["--preset", "tiny", "--vocab", "64", "--repeats", "2", "--dir", str(tmp_path / "c")]
    assert (
        common.main(
            "checkpoint_save",
            checkpoint_save.build_parser,
            checkpoint_save.run,
            [*argv, "--json", str(out)],
        )
        == 0
    )
    figures = json.loads(out.read_text())["figures"]
    assert [len(v) for v in figures["seconds"].values()] == [2, 2]
    assert figures["checkpoint_mb"] > 0 and not (tmp_path / "c").exists()
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "x").write_text("mine")
    assert (
        common.main("checkpoint_save", checkpoint_save.build_parser, checkpoint_save.run, argv) == 2
    )
    assert "not empty" in capsys.readouterr().err and (tmp_path / "c" / "x").exists()


def test_decoder_cached_step_against_the_whole_prefix(tmp_path):
    argv = ["--preset", "tiny", "--vocab", "100", "--batch", "2", "--beam", "2"]
    figures = bench(
        "decoder", [*argv, "--src-len", "5", "--steps", "3", "--threads", "1"], tmp_path
    )
    assert figures["rows"] == 4 and figures["cached_ms_per_step"] > 0
    assert figures["cache_speedup"] > 0


def test_decoder_names_a_missing_preset(capsys):
    from benchmarks import decoder

    assert common.main("decoder", decoder.build_parser, decoder.run, ["--preset", "huge"]) == 2
    assert "--preset huge: no transformer_huge.yaml; one of" in capsys.readouterr().err


def test_ctranslate2_pairs_six_engines_on_the_same_batches(
    tiny_checkpoint, demo_data_dir, tmp_path, capsys
):
    pytest.importorskip("ctranslate2")
    from nmt.data.tokenizer import Tokenizer

    # a shortlist of every token: nmt's and CTranslate2's reduced searches are the full ones
    tok = Tokenizer.from_file(demo_data_dir / "spm.model")
    shortlist = tmp_path / "all.txt"
    shortlist.write_text("\t" + " ".join(tok.pieces()[4:]) + "\n", encoding="utf-8")
    argv = ["--checkpoint", str(tiny_checkpoint), "--input", str(DEMO / "test.en"), "--lines"]
    argv += ["8", "--beams", "2", "1", "--max-len-b", "4", "--turns", "1", "--threads", "1"]
    argv += ["--ref", str(DEMO / "test.de"), "--shortlist", str(shortlist)]
    figures = bench("ctranslate2", argv, tmp_path)
    assert figures["sentences"] == 8 and len(figures["settings"]) == 2
    for setting in figures["settings"]:
        engines = setting["engines"]
        assert set(engines) == {
            "nmt fp32",
            "nmt int8",
            "nmt int8+shortlist",
            "ctranslate2 float32",
            "ctranslate2 int8",
            "ctranslate2 int8+vmap",
        }
        # the random model never ends early: every engine decodes 8 x (4 + </s>) tokens
        assert all(e["tokens"] == 8 * 5 for e in engines.values())
        assert setting["reference"] == "nmt fp32"
        assert engines["ctranslate2 float32"]["same_as_reference"] == 8
        assert engines["nmt int8+shortlist"]["same_as_reference"] is not None
        assert all(e["bleu"] is not None and e["cpu"] > 0 for e in engines.values())
        assert set(setting["ratios"]) == {"nmt fp32", "nmt int8", "nmt int8+shortlist"}
        assert setting["ratios"]["nmt int8"]["peer"] == "ctranslate2 int8"
    out = capsys.readouterr().out
    assert "| beam 2, 1 thread | sentences/s |" in out and "| nmt int8+shortlist |" in out


def test_ctranslate2_runs_nmt_int8_on_the_gemm_an_engine_names(
    tiny_checkpoint, tmp_path, monkeypatch
):
    """ "nmt int8 fbgemm" loads its model with NMT_INT8_GEMM=fbgemm, "nmt int8" with nmt's
    own choice, and the environment is as it was afterwards."""
    pytest.importorskip("ctranslate2")
    from nmt.model.quantize import GEMM_ENV, Int8Linear, int8_gemm

    monkeypatch.delenv(GEMM_ENV, raising=False)
    built: list[str] = []
    real_init = Int8Linear.__init__

    def spy(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        built.append(self.gemm)

    monkeypatch.setattr(Int8Linear, "__init__", spy)
    argv = ["--checkpoint", str(tiny_checkpoint), "--input", str(DEMO / "test.en"), "--lines"]
    argv += ["4", "--beams", "1", "--max-len-b", "3", "--turns", "1", "--threads", "1"]
    argv += ["--engines", "nmt fp32", "nmt int8 fbgemm"]
    figures = bench("ctranslate2", argv, tmp_path)
    engines = figures["settings"][0]["engines"]
    assert set(engines) == {"nmt fp32", "nmt int8 fbgemm"}
    assert built and set(built) == {"fbgemm"}
    assert GEMM_ENV not in os.environ
    built.clear()
    bench("ctranslate2", argv[:-2] + ["nmt int8"], tmp_path)
    assert set(built) == {int8_gemm(), int8_gemm(output_layer=True)}


def test_ctranslate2_runs_nmt_fp32_on_the_gemm_an_engine_names(
    tiny_checkpoint, tmp_path, monkeypatch
):
    """ "nmt fp32 onednn" packs its model's layers for oneDNN (NMT_FP32_GEMM=onednn), "nmt
    fp32 torch" leaves them to F.linear, and the environment is as it was afterwards."""
    pytest.importorskip("ctranslate2")
    from nmt.model.packed import FP32_GEMM_ENV, PackedLinear, onednn_fp32_available

    if not onednn_fp32_available():
        pytest.skip("this torch has no oneDNN fp32 linear")
    monkeypatch.delenv(FP32_GEMM_ENV, raising=False)
    packed: list[int] = []
    real_init = PackedLinear.__init__

    def spy(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        packed.append(self.out_features)

    monkeypatch.setattr(PackedLinear, "__init__", spy)
    argv = ["--checkpoint", str(tiny_checkpoint), "--input", str(DEMO / "test.en"), "--lines"]
    argv += ["4", "--beams", "1", "--max-len-b", "3", "--turns", "1", "--threads", "1"]
    figures = bench("ctranslate2", [*argv, "--engines", "nmt fp32 torch"], tmp_path)
    assert set(figures["settings"][0]["engines"]) == {"nmt fp32 torch"} and not packed
    figures = bench("ctranslate2", [*argv, "--engines", "nmt fp32 onednn"], tmp_path)
    assert set(figures["settings"][0]["engines"]) == {"nmt fp32 onednn"}
    assert packed  # every linear layer, the output layer among them
    assert FP32_GEMM_ENV not in os.environ


def test_ctranslate2_time_breakdown_sorts_operators_by_what_they_compute():
    from benchmarks.common import time_breakdown

    operators = [
        ("aten::addmm", 0.5, 10),
        ("quantized::linear_dynamic", 0.25, 4),
        ("aten::_scaled_dot_product_flash_attention_for_cpu", 0.125, 2),
        ("aten::scaled_dot_product_attention", 0.0625, 2),  # the wrapper: dispatch only
        ("aten::copy_", 0.0625, 7),
    ]
    parts = time_breakdown(operators, wall_seconds=1.25)
    assert parts == {
        "matrix products": 0.75,
        "attention": 0.125,
        "other operators": 0.125,
        "Python, dispatch, profiler": 0.25,
        "operator calls": 25.0,
    }
    # self times a hair over the wall (the profiler's rounding): the rest is 0, not negative
    assert time_breakdown(operators, wall_seconds=0.5)["Python, dispatch, profiler"] == 0.0


def test_ctranslate2_profile_prints_where_each_nmt_engine_s_time_goes(
    tiny_checkpoint, tmp_path, capsys
):
    pytest.importorskip("ctranslate2")
    argv = ["--checkpoint", str(tiny_checkpoint), "--input", str(DEMO / "test.en"), "--lines"]
    argv += ["4", "--beams", "1", "--max-len-b", "3", "--turns", "1", "--threads", "1"]
    argv += ["--engines", "nmt fp32", "ctranslate2 float32", "--profile"]
    bench("ctranslate2", argv, tmp_path)
    out = capsys.readouterr().out
    assert breakdown_line(out, "nmt fp32")[0][1] > 0  # the model's products ran under the profiler
    assert "# where ctranslate2" not in out  # CTranslate2's own time is not torch's to profile


def test_fairseq_generate_without_its_peer_says_what_to_run(tmp_path, capsys):
    from benchmarks import fairseq_generate as fg

    argv = ["--peer", str(tmp_path)]
    assert common.main("fairseq_generate", fg.build_parser, fg.run, argv) == 2
    err = capsys.readouterr().err
    assert "no fairseq venv there; run bash ../shared/bench/fairseq_peer.sh first" in err


def test_suite_table_from_its_report():
    from benchmarks import suite

    row = {"tok_s": 2000.0, "flop_s": 9e10, "matmul_peak_flop_s": 2e11, "peak_fraction": 0.45}
    report = {
        "date": "2026-11-23T10:00:00Z",
        "wall_seconds": 600.0,
        "machine": {
            "cpu": "AMD EPYC",
            "cores": 2,
            "cpu_flags": ["avx512_bf16"],
            "torch": "2.13.0+cpu",
            "torch_threads": 2,
            "load_average": {"start": 0.5, "end": 1.5},
        },
        "figures": {
            "params": {
                "repeats": 3,
                "train_repeats": 3,
                "threads": 2,
                "preprocess_workers": 2,
                "train_updates": 30,
                "train_warmup": 10,
                "gen_sentences": 200,
                "gen_model": "random transformer_small",
            },
            "preprocess": {"pairs_s": 60000.0, "peak_rss_mib": 220.0},
            "train": {"fp32": {**row, "peak_rss_mib": 1800.0}},
            "generate": {
                "beam 5, KV cache": {"sent_s": 55.7, "tok_s": 1021.0, "peak_rss_mib": 600}
            },
        },
    }
    table = suite.markdown(report)
    assert "AMD EPYC, 2 cores (avx512_bf16), torch 2.13.0+cpu, 2 torch threads" in table
    assert "| train transformer_small fp32 | 2,000 target tok/s | 90.0 GFLOP/s |" in table
    assert "| generate beam 5, KV cache | 55.7 sent/s, 1,021 target tok/s |  |  | 600 |" in table


def test_suite_worker_runs_in_a_subprocess_of_its_own(tiny_checkpoint, demo_data_dir):
    from benchmarks import suite

    params = {
        "checkpoint": str(tiny_checkpoint),
        "spm_cache": str(demo_data_dir / "spm.model"),
        "threads": 1,
        "input": str(DEMO / "test.en"),
        "sentences": 6,
        "beam": 2,
        "use_cache": True,
    }
    out = suite.measure("generate", params)
    assert out["sentences"] == 6 and out["sent_s"] > 0 and out["peak_rss_mib"] > 10


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--device", "cuda"], "--device cuda: torch sees no CUDA device; use --device cpu"),
        (["--precision", "fp16"], "--precision fp16: needs --device cuda; use fp32 or bf16"),
        (
            ["--engines", "nmt fp32", "ctranslate2 float16"],
            "--engines 'ctranslate2 float16': runs on --device cuda only; leave it out",
        ),
    ],
)
def test_ctranslate2_on_a_device_it_cannot_use_is_one_line(tiny_checkpoint, capsys, extra, message):
    pytest.importorskip("ctranslate2")
    from benchmarks import ctranslate2

    if torch.cuda.is_available() and extra[0] == "--device":
        pytest.skip("this machine has CUDA")
    argv = ["--checkpoint", str(tiny_checkpoint), *extra]
    assert common.main("ctranslate2", ctranslate2.build_parser, ctranslate2.run, argv) == 2
    assert message in capsys.readouterr().err


def test_ctranslate2_without_its_cuda_libraries_is_one_line(tiny_checkpoint, monkeypatch, capsys):
    """CTranslate2 4.x opens CUDA 12's cuBLAS when it first runs on a GPU; on a system
    without it (CUDA 13 only) the benchmark says so in one line. (No GPU here: the
    library's refusal is raised by a stand-in for ctranslate2.Translator.)"""
    ctranslate2 = pytest.importorskip("ctranslate2")
    from benchmarks import ctranslate2 as bench_ct2

    class NoCuda:
        def __init__(self, *args, **kwargs):
            pass

        def translate_batch(self, *args, **kwargs):
            raise RuntimeError("Library libcublas.so.12 is not found or cannot be loaded")

    monkeypatch.setattr(ctranslate2, "Translator", NoCuda)
    argv = ["--checkpoint", str(tiny_checkpoint), "--lines", "2", "--max-len-b", "2"]
    assert common.main("ctranslate2", bench_ct2.build_parser, bench_ct2.run, argv) == 2
    err = capsys.readouterr().err
    assert "--device cpu: ctranslate2: Library libcublas.so.12 is not found" in err
