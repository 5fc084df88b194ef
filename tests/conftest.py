"""Shared fixtures.

`demo_data_dir` (session): the demo corpus (data/demo) preprocessed with the default config,
exactly as `nmt-preprocess` with no overrides would, into a temporary directory. Training,
generation and end-to-end tests build on it instead of preprocessing again.
`small_corpus` / `preprocess_config`: a few hundred demo lines and a fast config for tests
that run nmt-preprocess themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DEMO_CORPUS = REPO / "data" / "demo"


def compose_preprocess(overrides: list[str]):
    """The PreprocessConfig dataclass that `nmt-preprocess <overrides>` would run with."""
    from nmt.cli import compose_config, to_dataclass

    return to_dataclass(compose_config("preprocess", overrides))


@pytest.fixture(scope="session")
def demo_corpus() -> Path:
    """data/demo: {train,valid,test}.{en,de}."""
    return DEMO_CORPUS


@pytest.fixture(scope="session")
def demo_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data dir of the demo corpus built with configs/preprocess.yaml's defaults."""
    from nmt.commands.preprocess import run

    dest = tmp_path_factory.mktemp("demo-data") / "demo"
    cfg = compose_preprocess(
        [
            f"data.trainpref={DEMO_CORPUS / 'train'}",
            f"data.validpref={DEMO_CORPUS / 'valid'}",
            f"data.testpref=[{DEMO_CORPUS / 'test'}]",
            f"data.dest={dest}",
            "workers=1",
        ]
    )
    run(cfg)
    return dest


@pytest.fixture
def small_corpus(tmp_path: Path) -> Path:
    """A folder with train (400 pairs), valid and test (50 pairs each) .en/.de from the demo."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    sizes = {"train": 400, "valid": 50, "test": 50}
    for split, n in sizes.items():
        for lang in ("en", "de"):
            lines = (DEMO_CORPUS / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()
            (folder / f"{split}.{lang}").write_text("\n".join(lines[:n]) + "\n", encoding="utf-8")
    return folder


@pytest.fixture
def preprocess_config(small_corpus: Path, tmp_path: Path) -> Callable[..., object]:
    """Factory: a fast PreprocessConfig for `small_corpus`, writing to tmp_path/out unless told.

    Arguments are Hydra overrides, applied after the base ones:
    `preprocess_config("clean.max_ratio=null", "workers=2")`.
    """

    def make(*overrides: str):
        base = [
            f"data.trainpref={small_corpus / 'train'}",
            f"data.validpref={small_corpus / 'valid'}",
            f"data.testpref=[{small_corpus / 'test'}]",
            f"data.dest={tmp_path / 'out'}",
            "spm.vocab_size=200",
            "spm.byte_fallback=false",
            "spm.num_threads=1",
            "workers=1",
        ]
        return compose_preprocess(base + list(overrides))

    return make


@pytest.fixture
def nmt_cli(capsys: pytest.CaptureFixture) -> Callable[..., tuple[int, str, str]]:
    """Run `nmt-<command> ARGS` in-process: returns (exit code, stdout, stderr)."""
    from nmt.cli import main

    def call(command: str, *argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            main(command, list(argv))
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        out, err = capsys.readouterr()
        return code, out, err

    return call


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`gpu` tests are skipped, not failed, where CUDA is missing."""
    if not any("gpu" in item.keywords for item in items):
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def one_thread():
    """The machine is shared: one torch thread is faster and steadier for small models.

    Test modules opt in with `pytestmark = pytest.mark.usefixtures("one_thread")`.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
