"""nmt: a neural machine translation toolkit (commands and a library).

    from nmt import Translator
    translator = Translator.from_checkpoint("runs/demo/checkpoint_best.pt")
    translator.translate(["I bought twenty-one books."])

Importing nmt is cheap and has no side effects: the public API below is imported on first
use (a module `__getattr__`), so `import nmt.data.config` does not import torch.

The modules and packages, bottom up (docs/ARCHITECTURE.md, "Layers"):

errors.py       NmtError, the one user-facing error, and its message helpers
fsutil.py       the one way files are written: atomic, durable, never over an input
processes.py    child processes that die with their parent; Ctrl-C and SIGTERM safety
textlines.py    lines of UTF-8 text from a file or stdin, invalid bytes refused or replaced
vocab.py        the special token ids (BOS, PAD, EOS, UNK)
runtime.py      device, precision and autocast, threads, TF32, seeds
distributed.py  torchrun's environment and the few collectives training needs
checkpoint.py   the checkpoint file: build, atomic save with a checksum, safe load
data/           raw parallel text -> data dir, and reading it back
model/          the Transformer: tensors in, tensors out
scoring.py      BLEU, chrF and TER with sacrebleu: nmt-score's core
generation/     the Translator: loading checkpoints, the search, nmt-generate
training/       nmt-train and nmt-average as a library
interop/        CTranslate2 export and fairseq import
serving/        nmt-serve: HTTP over the Translator
commands/       one thin module per command
config.py       the commands (COMMANDS) and renamed keys, registered with Hydra
config_errors.py  Hydra's composition errors as one line that keeps the fix
cli.py          the console entry points: compose, validate, run
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

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
