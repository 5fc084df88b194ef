"""nmt: a neural machine translation toolkit (commands and a library).

    from nmt import Translator
    translator = Translator.from_checkpoint("runs/demo/checkpoint_best.pt")
    translator.translate(["I bought twenty-one books."])

Importing nmt is cheap and has no side effects: the public API below is imported on first
use (a module `__getattr__`), so `import nmt.data.config` does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> the module that defines it
_LAZY = {
    "Translator": "nmt.generation.translator",
    "Translation": "nmt.generation.translator",
    "TargetScore": "nmt.generation.translator",
}

__all__ = ["TargetScore", "Translation", "Translator", "__version__"]

if TYPE_CHECKING:
    from nmt.generation.translator import TargetScore, Translation, Translator


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'nmt' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
