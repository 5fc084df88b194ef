"""The newcomer's path through the install: no trap from the clone's folder name, every
data folder shipped, and the optional extras (serving, TensorBoard) missing without harm.

A package that is not installed is stood in for by a module of its name, first on
PYTHONPATH, that raises ModuleNotFoundError as the import of a missing package does.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
IMPORT_TRANSLATOR = "import nmt; from nmt import Translator; print(nmt.__file__)"


def _without(tmp_path: Path, *modules: str) -> dict[str, str]:
    """An environment in which importing `modules` fails as if they were not installed."""
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    for name in modules:
        (hidden / f"{name}.py").write_text(
            f"raise ModuleNotFoundError(\"No module named '{name}'\", name={name!r})\n"
        )
    return {**os.environ, "PYTHONPATH": str(hidden), "NMT_DEBUG": ""}


def _clean_env() -> dict[str, str]:
    env = {**os.environ}
    env.pop("PYTHONPATH", None)
    return env


def test_the_folder_holding_the_clone_does_not_shadow_nmt(tmp_path: Path) -> None:
    """A clone is a folder named nmt; a script run from the folder above it saw that folder
    as an empty namespace package: "cannot import name 'Translator' from 'nmt' (unknown
    location)". scripts/setup.sh puts the checkout on sys.path (a .pth) to prevent it."""
    clone = tmp_path / "nmt"
    clone.mkdir()
    (clone / "pyproject.toml").write_text("[project]\nname = 'nmt'\n")  # a clone's top level
    proc = subprocess.run(
        [sys.executable, "-c", IMPORT_TRANSLATOR],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=_clean_env(),
    )
    assert proc.returncode == 0, f"{proc.stderr} (run scripts/setup.sh again)"
    assert Path(proc.stdout.strip()) == REPO / "nmt" / "__init__.py"


def test_the_trap_without_the_checkout_on_sys_path(tmp_path: Path) -> None:
    """What setup.sh's .pth prevents, reproduced: setuptools' editable install alone finds
    nmt after Python's own search of sys.path, which takes the clone's folder first."""
    site = Path(subprocess.check_output([sys.executable, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], text=True).strip())  # fmt: skip
    if not glob.glob(str(site / "__editable___nmt_*_finder.py")):
        pytest.skip("nmt is not installed in setuptools' editable mode here")
    (tmp_path / "nmt").mkdir()
    drop_checkout = f"import sys; sys.path.remove({str(REPO)!r}); "
    proc = subprocess.run(
        [sys.executable, "-c", drop_checkout + IMPORT_TRANSLATOR],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=_clean_env(),
    )
    assert proc.returncode == 1
    assert "cannot import name 'Translator' from 'nmt' (unknown location)" in proc.stderr


def test_every_data_folder_is_a_listed_package() -> None:
    """setuptools warns (dozens of lines per install) about a folder of package data that
    is not in `packages`, and the wheel would miss files: every folder under a listed
    package that holds files must be listed, with its files matched by package-data."""
    tomllib = pytest.importorskip("tomllib")
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapping, packages = setuptools["package-dir"], set(setuptools["packages"])
    data = setuptools["package-data"]

    def folder(package: str) -> Path:
        for name in sorted(mapping, key=len, reverse=True):
            if package == name or package.startswith(f"{name}."):
                rest = package[len(name) :].lstrip(".").replace(".", "/")
                return REPO / mapping[name] / rest
        raise AssertionError(f"{package}: no package-dir entry")

    for package in sorted(packages):
        for path in folder(package).iterdir():
            if not path.is_dir() or path.name == "__pycache__" or not any(path.iterdir()):
                continue
            sub = f"{package}.{path.name}"
            assert sub in packages, f"{path.relative_to(REPO)}: add {sub} to packages"
        files = [p for p in folder(package).iterdir() if p.is_file() and p.suffix != ".py"]
        for path in files:
            patterns = data.get(package, []) + data.get("*", [])
            assert any(path.match(p) for p in patterns), f"{path}: not in package-data"


def test_nmt_serve_without_the_serving_extra(tmp_path: Path) -> None:
    env = _without(tmp_path, "fastapi", "uvicorn")
    proc = subprocess.run(
        [str(BIN / "nmt-serve"), f"checkpoint={tmp_path / 'model.pt'}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("nmt-serve: error: nmt-serve needs the serving packages, and ")
    assert "pip install 'nmt[serve]'" in lines[0]
    # its config needs none of them
    proc = subprocess.run(
        [str(BIN / "nmt-serve"), "--cfg"], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0 and "port: 5000" in proc.stdout, proc.stderr


def test_nmt_train_without_tensorboard(demo_data_dir: Path, tmp_path: Path) -> None:
    """TensorBoard is an extra: training goes on, with a note that says how to get it."""
    run = tmp_path / "run"
    proc = subprocess.run(
        [
            str(BIN / "nmt-train"),
            f"data={demo_data_dir}",
            f"save_dir={run}",
            "model=transformer_tiny",
            "train_split=valid",
            "max_update=2",
            "max_tokens=500",
            "device=cpu",
            "threads=1",
            "logging.tensorboard=true",
        ],
        capture_output=True,
        text=True,
        env=_without(tmp_path, "tensorboard"),
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    notes = [line for line in proc.stderr.splitlines() if "TensorBoard is not installed" in line]
    assert len(notes) == 1 and "pip install 'nmt[tensorboard]'" in notes[0]
    assert "train.jsonl is written" in notes[0]
    assert (run / "train.jsonl").stat().st_size > 0 and (run / "checkpoint_last.pt").is_file()
    assert not (run / "tensorboard").exists()
