"""nmt-serve: translation over HTTP (LibreTranslate's API, nmt's /v1 API, a web page);
the work is nmt.serving.serve."""

from __future__ import annotations

from nmt.errors import NmtError
from nmt.serving.config import ServeConfig


def run(cfg: ServeConfig) -> int:
    try:
        from nmt.serving.server import serve
    except ImportError as exc:
        if (exc.name or "nmt").split(".")[0] == "nmt":
            raise
        # FastAPI, uvicorn and the rest are an extra: a user who only trains goes without
        raise NmtError(
            f"nmt-serve needs the serving packages, and {exc.name} is not installed; install "
            "them with pip install 'nmt[serve]' (in a clone: .venv/bin/pip install -e '.[serve]')"
        ) from exc
    return serve(cfg)
