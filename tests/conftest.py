"""Shared fixtures.

`demo_data_dir` (session): the demo corpus (data/demo) preprocessed with the default config
(PreprocessConfig's defaults, which are configs/preprocess.yaml's: see
tests/integration/test_preprocess_cli.py) into a temporary directory, by
`nmt.data.build_data_dir`. Training, generation and end-to-end tests build on it instead of
preprocessing again.
`multilingual_data_dir` (session): en, de and fr in one data dir, built to meta.json's
contract by tests/helpers_multilingual.py.
`tiny_trained_checkpoint` (session): a tiny model trained briefly on it, for tests of
search, batching and decoding options that need a model which has learned something.
`small_corpus` / `preprocess_config`: a few hundred demo lines and a fast config for tests
that preprocess themselves.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DEMO_CORPUS = REPO / "data" / "demo"

# A suite started in the background by a non-interactive shell (`pytest &`, nohup) inherits
# SIGINT ignored, and so would every process it starts (an ignored signal stays ignored
# across exec): the Ctrl-C tests would see nothing happen. A handler of our own is reset
# to the default in each child.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def preprocess_config_with(overrides: list[str]):
    """A PreprocessConfig: the defaults with `key=value` overrides in Hydra's syntax
    (`clean.max_ratio=null`, `data.testpref=[a,b]`), checked against the dataclass by
    OmegaConf, as the CLI checks them (no Hydra, no CLI layer involved)."""
    from omegaconf import OmegaConf

    from nmt.data.config import PreprocessConfig

    merged = OmegaConf.merge(
        OmegaConf.structured(PreprocessConfig), OmegaConf.from_dotlist(overrides)
    )
    return OmegaConf.to_object(merged)


@pytest.fixture(scope="session")
def overridden_preprocess_config() -> Callable[[list[str]], object]:
    """`preprocess_config_with`, for tests that compare it with the CLI's composition."""
    return preprocess_config_with


@pytest.fixture(scope="session")
def demo_corpus() -> Path:
    """data/demo: {train,valid,test}.{en,de}."""
    return DEMO_CORPUS


@pytest.fixture(scope="session")
def demo_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data dir of the demo corpus built with the default preprocessing config."""
    from nmt.data import build_data_dir

    dest = tmp_path_factory.mktemp("demo-data") / "demo"
    cfg = preprocess_config_with(
        [
            f"data.trainpref={DEMO_CORPUS / 'train'}",
            f"data.validpref={DEMO_CORPUS / 'valid'}",
            f"data.testpref=[{DEMO_CORPUS / 'test'}]",
            f"data.dest={dest}",
            "workers=1",
        ]
    )
    build_data_dir(cfg)
    return dest


@pytest.fixture(scope="session")
def multilingual_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small multilingual data dir (en, de, fr; tests/helpers_multilingual.py)."""
    from tests.helpers_multilingual import build_multilingual_data_dir

    return build_multilingual_data_dir(DEMO_CORPUS, tmp_path_factory.mktemp("multi") / "data")


@pytest.fixture(scope="session")
def tiny_trained_checkpoint(demo_data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests.helpers.tiny_config trained for 60 updates on `demo_data_dir`."""
    from tests.helpers import run_training, tiny_config

    run = tmp_path_factory.mktemp("tiny-trained-run")
    run_training(tiny_config(demo_data_dir, run, max_update=60))
    return run / "checkpoint_last.pt"


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

    Arguments are `key=value` overrides (as on the command line), applied after the base ones:
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
        return preprocess_config_with(base + list(overrides))

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


@pytest.fixture(autouse=True)
def no_distributed_job_leaks():
    """nmt.distributed's record of a joined job as it was before the test: a test that
    simulates a job in this process (test_gpu_path) must not make a later in-process CLI
    error leave like a rank, with os._exit (nmt.cli._exit), which would end pytest."""
    import sys

    module = sys.modules.get("nmt.distributed")
    before = getattr(module, "_joined_a_job", False)
    yield
    module = sys.modules.get("nmt.distributed")
    if module is not None:
        module._joined_a_job = before  # type: ignore[attr-defined]


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
