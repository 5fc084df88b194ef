"""nmt-serve: translation over HTTP (LibreTranslate's API, nmt's /v1 API, a web page);
the work is nmt.serving.serve."""

from __future__ import annotations

from nmt.serving.config import ServeConfig
from nmt.serving.server import serve


def run(cfg: ServeConfig) -> int:
    return serve(cfg)
