"""Data: raw parallel text -> data dir (`build_data_dir`), and reading it back.

`build_data_dir` is imported on first use, so `import nmt.data.config` stays cheap (no
SentencePiece, numpy or tqdm).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nmt.data.build import BuildReport, build_data_dir

__all__ = ["BuildReport", "build_data_dir"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from nmt.data import build

        return getattr(build, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
