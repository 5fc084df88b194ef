"""nmt-serve as a real process for the integration tests: the console script on a free
loopback port (port=0, the port read from its first line), ready once /health says 200."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from tests.helpers import run_training, tiny_config

NMT_SERVE = Path(sys.executable).parent / "nmt-serve"
SEARCH_ARGS = ["beam=4", "max_len_a=1.0", "max_len_b=5"]  # a tiny model's outputs stay short


def train_checkpoint(data_dir: Path, run: Path) -> Path:
    """The tiny model of tests/helpers.py after 60 updates."""
    run_training(tiny_config(data_dir, run, max_update=60))
    return run / "checkpoint_last.pt"


def nmt_generate(checkpoint: Path, lines: list[str], folder: Path, *args: str) -> list[str]:
    """nmt-generate's translations of `lines` (SEARCH_ARGS, one CPU thread, `args` over
    them), as the console command writes them (files in `folder`)."""
    (folder / "in.en").write_text("\n".join(lines) + "\n", encoding="utf-8")
    subprocess.run(
        [
            str(NMT_SERVE.parent / "nmt-generate"),
            f"checkpoint={checkpoint}",
            f"input={folder / 'in.en'}",
            f"output={folder / 'out.de'}",
            "device=cpu",
            "threads=1",
            *SEARCH_ARGS,
            *args,
        ],
        check=True,
        capture_output=True,
    )
    return (folder / "out.de").read_text(encoding="utf-8").splitlines()


class ServeProcess:
    """`nmt-serve checkpoint=... port=0 device=cpu threads=1 ...` started and ready."""

    def __init__(self, checkpoint: Path | None, *args: str, ready: bool = True):
        command = [str(NMT_SERVE), "port=0", "device=cpu", "threads=1", *SEARCH_ARGS, *args]
        if checkpoint is not None:
            command.insert(1, f"checkpoint={checkpoint}")
        self.proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.lines: list[str] = []
        self._announced = threading.Event()
        self.url = ""
        threading.Thread(target=self._read, daemon=True).start()
        if not self._announced.wait(120):
            self.stop()
            raise AssertionError(f"nmt-serve did not start: {self.output()}")
        if not self.url:
            raise AssertionError(f"nmt-serve exited: {self.output()}")
        if ready:
            self.wait_ready()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            found = re.search(r"serving on (http://\S+)", line)
            if found:
                self.url = found.group(1)
                self._announced.set()
        self._announced.set()

    def output(self) -> str:
        return "".join(self.lines)

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"nmt-serve exited ({self.proc.returncode}): {self.output()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"nmt-serve not ready in {timeout} s: {self.output()}")

    def terminate(self) -> None:
        self.proc.send_signal(signal.SIGTERM)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode
