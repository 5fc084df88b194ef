"""A GPU stand-in for the tests that count host-device synchronisations: the meta device.

On a GPU the host waits for the device whenever it reads a value computed there (`.item()`,
`.tolist()`, `.cpu()`, `bool(t)`, a boolean-mask index, `nonzero()`...); at every update or
decoding step such a read drains the GPU's queue of work. Meta tensors have shapes but no
values, and nmt takes its GPU paths on any device that is not the CPU, so code run on the
meta device behaves as on a GPU, except that:
- every read of a value goes through `DeviceReads`, which counts it and answers it (zeros,
  or what the test scripts), and
- an operation whose output shape depends on values (nonzero, a boolean-mask index) raises
  NotImplementedError: the meta device has no values to find it from, just as a GPU would
  have to be waited for.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

# Tensor methods through which the host reads values.
READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")


def _zeros(t: torch.Tensor, method: str) -> Any:
    host = torch.zeros(t.shape, dtype=t.dtype)
    if method == "cpu":
        return host
    return getattr(host, method)()


class DeviceReads:
    """Counts the host's reads of meta tensors (`count`, and `log` of (method, shape)).

    `answer(tensor, method)` gives each read's value: the method's result on a CPU tensor
    of the same shape and dtype (e.g. `torch.tensor([...]).tolist()`); None means zeros.
    """

    def __init__(
        self,
        monkeypatch: pytest.MonkeyPatch,
        answer: Callable[[torch.Tensor, str], Any] | None = None,
    ):
        self.count = 0
        self.log: list[tuple[str, tuple[int, ...]]] = []
        self.answer = answer
        for method in READS:
            monkeypatch.setattr(
                torch.Tensor, method, self._wrap(method, getattr(torch.Tensor, method))
            )

    def _wrap(self, method: str, real: Callable) -> Callable:
        def read(t: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if t.device.type != "meta":
                return real(t, *args, **kwargs)
            self.count += 1
            self.log.append((method, tuple(t.shape)))
            value = self.answer(t, method) if self.answer is not None else None
            return _zeros(t, method) if value is None else value

        return read
