"""The malformed-input battery against a real nmt-serve process (with an API key): each
request of the table is answered 4xx with a one-line JSON error, writes no traceback and
only a line or two to the server's log, and leaves the server healthy. The whole table
runs against one server in seconds."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import httpx
import pytest

from tests.integration.serve_process import ServeProcess, train_checkpoint

KEY = "k3y"
JSON = {"Content-Type": "application/json"}
FORM = {"Content-Type": "application/x-www-form-urlencoded"}
LIBRE = {"q": "one", "source": "en", "target": "de", "api_key": KEY}
NATIVE = {"texts": ["one"], "api_key": KEY}
SCORE = {"sources": ["one"], "targets": ["eins"], "api_key": KEY}
MAX_CHARS = 2000
LOG_BYTES_PER_REQUEST = 600  # the access log line and one line of warning at most
HUGE_INT = "1" + "0" * 400  # no float holds it
SURROGATES = ('"\\ud800"', '"\\udc80x"', '"a\\udfff"')  # lone surrogates as JSON writes them


def _json(fields: dict, **raw: str) -> bytes:
    """`fields` as JSON with `raw` fields spliced in as written (NaN, 1e999, "\\ud800")."""
    text = json.dumps(fields)
    for key, value in raw.items():
        text = text[:-1] + f', "{key}": {value}}}'
    return text.encode()


def _cases() -> list[tuple[str, str, str, dict, bytes]]:
    """(name, method, path, headers, body): every one a client's mistake."""
    cases: list[tuple[str, str, str, dict, bytes]] = []

    def post(name: str, path: str, body: bytes, headers: dict | None = None) -> None:
        cases.append((name, "POST", path, JSON if headers is None else headers, body))

    # bodies that are not a JSON object, on every POST route
    for path in ("/translate", "/detect", "/v1/translate", "/v1/score"):
        for name, body in (
            ("empty", b""),
            ("cut", b'{"q": "one", '),
            ("not json", b"nul"),
            ("bad utf-8", b"\xff\xfe{}"),
            ("bad utf-8 in a string", b'{"q": "\xff", "texts": ["\xc3"]}'),
            ("a string", b'"one"'),
            ("a list", b"[1, 2]"),
            ("null", b"null"),
            ("a number", b"1e999"),
            ("nested too deep", b"[" * 100_000 + b"]" * 100_000),
            ("a 5000-digit number", b'{"q": ' + b"9" * 5000 + b"}"),
        ):
            post(f"{path} {name}", path, body)
    # LibreTranslate's /translate: wrong types and values
    for key, values in (
        ("q", ("5", "{}", "[1]", "[null]", "true", "null", '""', "[]")),
        ("source", ("5", "[]", "{}", '""', '"xx"', "null")),
        ("target", ("5", '"xx"', '""')),
        ("format", ('"html"', "5", "[]")),
        ("alternatives", ('"x"', "[]", "{}", "true", "-1", "99", "1e308", HUGE_INT)),
        ("alternatives", ("Infinity", "-Infinity", "NaN", '"1e3"', '"Infinity"', "2.5")),
        ("api_key", ('"nope"', "5", "[]", '""')),
    ):
        for value in values:
            fields = {k: v for k, v in LIBRE.items() if k != key}
            post(f"/translate {key}={value[:12]}", "/translate", _json(fields, **{key: value}))
    post(
        "/translate auto into xx", "/translate", _json({**LIBRE, "source": "auto", "target": "xx"})
    )
    post("/translate too long", "/translate", _json({**LIBRE, "q": "x" * (MAX_CHARS + 1)}))
    post("/translate too many", "/translate", _json({**LIBRE, "q": ["one"] * 17}))
    post("/detect q=5", "/detect", _json({"q": 5, "api_key": KEY}))
    post("/detect no q", "/detect", _json({"api_key": KEY}))
    # nmt's /v1 routes: wrong types, non-finite and absurd numbers, bad values
    for key, values in (
        ("texts", ('"one"', "[1]", "null", "{}", "[[]]")),
        ("beam", ('"4"', "4.5", "true", "-1", "0", "1000000", "1e308", HUGE_INT)),
        ("nbest", ("0", "-1", "99")),
        ("lenpen", ("NaN", "Infinity", "-Infinity", "1e308", '"1"')),
        ("max_len_a", ("NaN", "Infinity", "-1", "-1e308")),
        ("max_len_b", ("-1", "1e308", "Infinity", f"-{HUGE_INT}")),
        ("min_len", ("-1", HUGE_INT, "1000000")),
        ("unkpen", ("NaN", "Infinity", "-Infinity", "1e308", "-1e308", "-100")),
        ("temperature", ("0", "-1", "NaN", "Infinity", "1e-30")),
        ("sampling_topp", ("0", "2", "NaN")),
        ("sampling_topk", ("-1", "5")),
        ("seed", ("-1", HUGE_INT)),
        ("no_repeat_ngram_size", ("-1", "NaN")),
        ("use_cache", ("false",)),
        ("return_scores", ('"yes"', "1")),
        ("prefixes", ('"x"', "[1]", '["a", "b"]')),
        ("model", ("5", '"nope"', '""')),
        ("bogus", ("1",)),
    ):
        for value in values:
            post(
                f"/v1/translate {key}={value[:12]}", "/v1/translate", _json(NATIVE, **{key: value})
            )
    for key, values in (
        ("sources", ('"one"', "[1]", '["one", "two"]')),
        ("targets", ("null", '["a", "b"]')),
        ("lenpen", ("NaN", "Infinity", "1e308")),
        ("beam", ("4",)),
    ):
        for value in values:
            fields = {k: v for k, v in SCORE.items() if k != key}
            post(f"/v1/score {key}={value[:12]}", "/v1/score", _json(fields, **{key: value}))
    post("/v1/translate source only", "/v1/translate", _json({**NATIVE, "source": "en"}))
    post(
        "/v1/translate pair not served",
        "/v1/translate",
        _json({**NATIVE, "source": "fr", "target": "de"}),
    )
    post("/v1/translate no texts", "/v1/translate", _json({"api_key": KEY}))
    post(
        "/v1/translate too long",
        "/v1/translate",
        _json({**NATIVE, "texts": ["x" * (MAX_CHARS + 1)]}),
    )
    post("/v1/translate too many", "/v1/translate", _json({**NATIVE, "texts": ["one"] * 17}))
    post(
        "/v1/translate over the body limit",
        "/v1/translate",
        b'{"texts": ["' + b"x" * 1_100_000 + b'"]}',
    )
    # lone surrogates, in every text field
    for surrogate in SURROGATES:
        for key in ("q", "source", "target", "format", "api_key", "alternatives"):
            fields = {k: v for k, v in LIBRE.items() if k != key}
            post(f"/translate {key}={surrogate}", "/translate", _json(fields, **{key: surrogate}))
        post(f"/translate q=[{surrogate}]", "/translate", _json(LIBRE, q=f'["one", {surrogate}]'))
        post(f"/detect q={surrogate}", "/detect", _json({"api_key": KEY}, q=surrogate))
        for key in ("model", "source", "api_key"):
            fields = {k: v for k, v in NATIVE.items() if k != key}
            post(
                f"/v1/translate {key}={surrogate}",
                "/v1/translate",
                _json(fields, **{key: surrogate}),
            )
        post(
            f"/v1/translate texts={surrogate}",
            "/v1/translate",
            _json({"api_key": KEY}, texts=f"[{surrogate}]"),
        )
        post(
            f"/v1/translate prefixes={surrogate}",
            "/v1/translate",
            _json(NATIVE, prefixes=f"[{surrogate}]"),
        )
        post(
            f"/v1/translate a key {surrogate}",
            "/v1/translate",
            _json(NATIVE, **{surrogate[1:-1]: "1"}),
        )
        post(
            f"/v1/score targets={surrogate}",
            "/v1/score",
            _json({"sources": ["one"], "api_key": KEY}, targets=f"[{surrogate}]"),
        )
    # methods, paths and content types
    for method, path in (
        ("GET", "/translate"),
        ("PUT", "/translate"),
        ("DELETE", "/v1/translate"),
        ("GET", "/v1/score"),
        ("POST", "/health"),
        ("POST", "/languages"),
        ("PATCH", "/v1/models"),
        ("POST", "/nope"),
        ("GET", "/v1/nope"),
        ("GET", "/static/../../../etc/passwd"),
        ("GET", "/static/%2e%2e/%2e%2e/etc/passwd"),
        ("GET", "/static/nope.js"),
        ("PROPFIND", "/translate"),
        ("FOO", "/translate"),  # not an HTTP method: refused by the HTTP layer, in JSON
    ):
        cases.append((f"{method} {path}", method, path, JSON, b"{}"))
    text = {"Content-Type": "text/plain"}
    post("/translate as text/plain", "/translate", json.dumps(LIBRE).encode(), text)
    multipart = {"Content-Type": "multipart/form-data"}
    post("/translate multipart without a boundary", "/translate", b"q=one", multipart)
    junk = {"Content-Type": "multipart/form-data; boundary=x"}
    post("/translate multipart junk", "/translate", b"--x\r\nnonsense\r\n\r\n", junk)
    post("/v1/translate as a form", "/v1/translate", b"texts=one&api_key=k3y", FORM)
    post("/v1/translate as text/plain", "/v1/translate", json.dumps(NATIVE).encode(), text)
    # forms and query strings
    for name, body in (
        ("no source", b"q=one&target=de&api_key=k3y"),
        ("alternatives=Infinity", b"q=one&source=en&target=de&alternatives=Infinity&api_key=k3y"),
        ("alternatives=1e999", b"q=one&source=en&target=de&alternatives=1e999&api_key=k3y"),
        ("alternatives=-3", b"q=one&source=en&target=de&alternatives=-3&api_key=k3y"),
        ("a wrong key", b"q=one&source=en&target=de&api_key=nope"),
        ("no key", b"q=one&source=en&target=de"),
        ("binary junk", bytes(range(256))),
        ("undecodable escapes", b"q=%ED%A0%80&source=%FF&target=de&api_key=nope"),
    ):
        post(f"/translate form {name}", "/translate", body, FORM)
    cases.append(
        ("query wrong key", "POST", "/translate?q=one&source=en&target=de&api_key=x", FORM, b"")
    )
    # API keys: Bearer variants that are not this server's key
    for authorization in (
        "Bearer nope",
        "Bearer",
        "Bearer:k3y",
        "bearer k3yy",
        "Basic azN5",
        "Token k3y",
        f"Bearer {KEY}x",
        b"Bearer \xc3\xa9",
    ):
        headers = {**JSON, "Authorization": authorization}
        for path, body in (("/translate", {**LIBRE}), ("/v1/translate", {**NATIVE})):
            body.pop("api_key")
            post(
                f"{path} Authorization: {authorization!r}", path, json.dumps(body).encode(), headers
            )
    return cases


CASES = _cases()


@pytest.fixture(scope="module")
def checkpoint(demo_data_dir, tmp_path_factory) -> Path:
    return train_checkpoint(demo_data_dir, tmp_path_factory.mktemp("serve-malformed-run"))


@pytest.fixture(scope="module")
def server(checkpoint):
    process = ServeProcess(
        checkpoint,
        f"api_key={KEY}",
        "max_request_sentences=16",
        f"max_request_chars={MAX_CHARS}",
    )
    yield process
    assert process.stop() == 0, process.output()


def _log_after(server: ServeProcess, mark: int, health_seen: int, timeout: float = 10) -> str:
    """The server's log from line `mark` on, once the access line of the next /health
    request (the health_seen + 1-th) is in: everything the request before it wrote."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = list(server.lines)
        if sum("GET /health" in line for line in lines) > health_seen:
            return "".join(line for line in lines[mark:] if "GET /health" not in line)
        time.sleep(0.005)
    raise AssertionError(f"no access line for /health in {timeout} s: {server.output()[-2000:]}")


def test_the_table_is_large():
    assert len(CASES) > 100 and len({name for name, *_ in CASES}) == len(CASES)


def test_each_malformed_request_is_a_4xx_with_one_line(server):
    """Every case answered 4xx with `{"error": one line}`, no traceback and at most a
    line or two in the log, and /health still 200 after it."""
    failures = []
    health_seen = sum("GET /health" in line for line in server.lines)
    # a connection each: a body refused unread (413) may close its connection
    fresh = httpx.Limits(max_keepalive_connections=0)
    with httpx.Client(base_url=server.url, timeout=60, limits=fresh) as client:
        for name, method, path, headers, body in CASES:
            mark = len(server.lines)
            answer = client.request(method, path, content=body, headers=headers)
            health = client.get("/health")
            log = _log_after(server, mark, health_seen)
            health_seen += 1
            problems = _problems(answer, log)
            if health.status_code != 200:
                problems.append(f"/health {health.status_code}")
            if problems:
                failures.append(f"{name}: {', '.join(problems)}: {answer.text[:200]}")
    assert not failures, f"{len(failures)} of {len(CASES)} cases:\n" + "\n".join(failures)


def _problems(answer: httpx.Response, log: str) -> list[str]:
    """What is wrong with a refusal: not a 4xx, not a one-line JSON error, a traceback or
    more than a line or two in the log."""
    problems = []
    if not 400 <= answer.status_code < 500:
        problems.append(f"status {answer.status_code}")
    try:
        error = answer.json()["error"]
        if not isinstance(error, str) or "\n" in error or not error:
            problems.append("not a one-line error")
    except (ValueError, KeyError, TypeError):
        problems.append("not a JSON error")
    if "Traceback" in log or "Exception" in log:
        problems.append("a traceback in the log")
    if len(log.encode()) > LOG_BYTES_PER_REQUEST:
        problems.append(f"{len(log.encode())} bytes of log")
    return problems


def test_errors_name_the_field(server):
    """The refusal of a surrogate or a non-finite number says which field it was."""
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for path, body, needle in (
            ("/translate", _json({**LIBRE, "q": "x"}, q='"\\ud800"'), "q"),
            ("/translate", _json(LIBRE, alternatives="Infinity"), "alternatives"),
            ("/v1/translate", _json(NATIVE, prefixes='["\\ud800"]'), "prefixes"),
            ("/v1/translate", _json(NATIVE, unkpen="NaN"), "unkpen"),
            ("/v1/score", _json(SCORE, lenpen="Infinity"), "lenpen"),
        ):
            answer = client.post(path, content=body, headers=JSON)
            assert 400 <= answer.status_code < 500 and needle in answer.json()["error"], answer.text


def test_bearer_and_query_keys_are_accepted(server):
    """The API key as LibreTranslate takes it (JSON, form, query) and as a Bearer token,
    on every route that needs it."""
    bearer = {"Authorization": f"Bearer {KEY}"}
    pair = {"q": "one", "source": "en", "target": "de"}
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for answer in (
            client.post("/translate", json=pair, headers=bearer),
            client.post("/translate", data=pair, headers=bearer),
            client.post("/translate", json=pair, params={"api_key": KEY}),
            client.post("/translate", params={**pair, "api_key": KEY}),
            client.post("/translate", data={**pair, "api_key": KEY}),
            client.post("/detect", json={"q": "one"}, headers=bearer),
            client.post("/v1/translate", json={"texts": ["one"]}, headers=bearer),
            client.post("/v1/translate", json={"texts": ["one"]}, params={"api_key": KEY}),
            client.post("/v1/score", json={"sources": ["a"], "targets": ["b"]}, headers=bearer),
        ):
            assert answer.status_code == 200, (answer.request.url, answer.text)


def test_a_huge_max_len_is_capped_at_the_model(server):
    """max_len_a and max_len_b take any finite non-negative value: the output is capped at
    the model's longest, as for smaller values beyond it."""
    with httpx.Client(base_url=server.url, timeout=60) as client:
        capped = [
            client.post("/v1/translate", json={**NATIVE, **extra})
            for extra in ({"max_len_a": 1e308}, {"max_len_b": 10**400}, {"max_len_b": 10**6})
        ]
    assert all(a.status_code == 200 for a in capped), [a.text for a in capped]
    texts = {a.json()["results"][0]["translations"][0]["text"] for a in capped}
    assert len(texts) == 1


def test_extreme_but_valid_searches_are_answered(server):
    """Values a search takes, however extreme, are answered 200 with JSON: sampling at
    the lowest temperature, and a search whose every token gets forbidden (its score
    is null: JSON has no -inf)."""
    with httpx.Client(base_url=server.url, timeout=120) as client:
        for extra in (
            {"sampling": True, "temperature": 1e-6, "beam": 4, "nbest": 4},
            {"no_repeat_ngram_size": 1, "max_len_b": 10**6, "min_len": 1000},
            {"sampling": True, "unkpen": -50.0, "temperature": 1e6},
        ):
            answer = client.post("/v1/translate", json={**NATIVE, **extra, "return_scores": True})
            assert answer.status_code == 200, (extra, answer.text)
            for t in answer.json()["results"][0]["translations"]:
                assert t["score"] is None or math.isfinite(t["score"]), t
