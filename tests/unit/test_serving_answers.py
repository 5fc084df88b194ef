"""What nmt-serve's answers may show: an internal error is logged once with its traceback
and answered without its text; /docs and /openapi.json as api_docs says (off, behind the
key, public), from a page with no third-party script. In-process (TestClient), no model:
these routes answer while the models would still be loading."""

from __future__ import annotations

import logging
import re

import pytest
from fastapi.testclient import TestClient

from nmt.serving import ServeConfig, create_app

KEY = "s3cret"


def _client(**options) -> TestClient:
    """An app whose models are never loaded (no lifespan: TestClient outside `with`)."""
    return TestClient(create_app(ServeConfig(checkpoint="unused.pt", device="cpu", **options)))


def test_an_internal_error_is_logged_once_and_answered_without_its_text(caplog):
    client = _client()

    @client.app.get("/broken")  # type: ignore[attr-defined]
    async def broken() -> None:
        raise RuntimeError("/home/someone/secret/model.pt: a bug")

    with caplog.at_level(logging.INFO, logger="nmt.serving"):
        answer = client.get("/broken")
    assert answer.status_code == 500
    body = answer.json()
    assert body["error"] == "internal error" and re.fullmatch(r"[0-9a-f]{8}", body["request"])
    assert "secret" not in answer.text
    logged = [r for r in caplog.records if r.exc_info]
    assert len(logged) == 1 and body["request"] in logged[0].getMessage()
    assert "secret" in logged[0].exc_text or "secret" in str(logged[0].exc_info[1])
    assert client.get("/v1/models").status_code == 503  # the server goes on


def _docs(client: TestClient, **request) -> tuple[int, int]:
    return (
        client.get("/docs", **request).status_code,
        client.get("/openapi.json", **request).status_code,
    )


def test_the_docs_are_behind_the_key_by_default():
    keyed = _client(api_key=KEY)
    assert _docs(keyed) == (403, 403)
    assert _docs(keyed, params={"api_key": "nope"}) == (403, 403)
    assert _docs(keyed, params={"api_key": KEY}) == (200, 200)
    assert _docs(keyed, headers={"Authorization": f"Bearer {KEY}"}) == (200, 200)
    assert _docs(_client()) == (200, 200)  # no key: as open as the translation routes


@pytest.mark.parametrize(
    "api_docs, without_key, with_key",
    [("off", (404, 404), (404, 404)), ("public", (200, 200), (200, 200))],
)
def test_api_docs_off_and_public(api_docs, without_key, with_key):
    client = _client(api_key=KEY, api_docs=api_docs)
    assert _docs(client) == without_key
    assert _docs(client, params={"api_key": KEY}) == with_key
    assert client.get("/redoc").status_code == 404  # FastAPI's own pages are never served


def test_the_docs_page_loads_nothing_from_elsewhere_and_shows_every_route():
    client = _client(api_docs="public")
    page = client.get("/docs").text
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page), "a third-party asset"
    assert "<script src" not in page and "@import" not in page and "url(" not in page
    assert 'fetch("openapi.json" + location.search)' in page  # the key goes along
    api = client.get("/openapi.json").json()
    assert {"/translate", "/v1/translate", "/v1/score", "/v1/models"} <= set(api["paths"])
    assert "/docs" not in api["paths"] and "/openapi.json" not in api["paths"]
