"""Translation as a service: nmt-serve's FastAPI app over nmt.Translator.

config.py          ServeConfig (the server, its limits, batching), ModelSpec (a model by name)
models.py          ModelRegistry: the loaded models, by name and by direction (multilingual too)
batching.py        BatchQueue: requests' sentences batched across clients, one worker per model
admission.py       whether a new job's work can be done before the deadlines waiting
service.py         what every route does: limits, search options, queueing, timeouts
disconnect.py      ClientWatch, client_gone(): whether a request's client has left
libretranslate.py  LibreTranslate's /translate and /languages
native.py          /v1/translate, /v1/score, /v1/models: every generation option
metrics.py         Prometheus metrics (prometheus-client)
errors.py          ApiError: a refused request, answered as {"error": message}; check_text
languages.py       language names of codes, for /languages and the page
app.py             create_app(cfg): routes, body limit, /health, /metrics, the page, /docs
handlers.py        error answers: {"error": message} with its status; a bug's 500 logged once
server.py          serve(cfg): uvicorn on a bound socket, SIGTERM drains and exits 0
static/            the web page at / (plain HTML and JavaScript) and /docs (self-contained)
protocol.py        the bounded HTTP/1.1 protocol uvicorn runs: URL, header, connection limits, timeouts
access_log.py      query-string secrets (api_key, key, token) out of uvicorn's access log

Importing nmt.serving (or its config) imports neither FastAPI nor torch; `create_app` and
`serve` are imported on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_LAZY = {
    "ServeConfig": "nmt.serving.config",
    "ModelSpec": "nmt.serving.config",
    "create_app": "nmt.serving.app",
    "serve": "nmt.serving.server",
}

__all__ = ["ModelSpec", "ServeConfig", "create_app", "serve"]

if TYPE_CHECKING:
    from nmt.serving.app import create_app
    from nmt.serving.config import ModelSpec, ServeConfig
    from nmt.serving.server import serve


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'nmt.serving' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
