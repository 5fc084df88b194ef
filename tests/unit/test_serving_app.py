"""nmt.serving.create_app in-process (FastAPI's TestClient) on a tiny checkpoint trained
here: LibreTranslate's request shapes and answers, nmt's /v1 API equal to the Translator's
own answers, errors and limits, the API key, /health, /metrics and the page."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from nmt import Translator
from nmt.errors import NmtError
from nmt.serving import ModelSpec, ServeConfig, create_app
from nmt.serving.models import ModelRegistry
from tests.helpers import run_training, tiny_config
from tests.rounding import sum_tolerance, text_logprob_tolerance

pytestmark = pytest.mark.usefixtures("one_thread")

SEARCH = dict(beam=4, max_len_a=1.0, max_len_b=5)
LIMITS = dict(max_request_chars=600, max_request_sentences=12, max_body_bytes=4000)


@pytest.fixture(scope="module")
def checkpoint(demo_data_dir, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("serving-app-run")
    run_training(tiny_config(demo_data_dir, run, max_update=60))
    return run / "checkpoint_last.pt"


def _config(checkpoint: Path | None, **kw) -> ServeConfig:
    options = dict(device="cpu", max_wait_ms=5.0, **SEARCH, **LIMITS)
    options.update(kw)
    return ServeConfig(checkpoint=None if checkpoint is None else str(checkpoint), **options)


@pytest.fixture(scope="module")
def cfg(checkpoint) -> ServeConfig:
    return _config(checkpoint)


@pytest.fixture(scope="module")
def registry(cfg):
    models = ModelRegistry.load(cfg)
    yield models
    models.close(30)


@pytest.fixture(scope="module")
def client(cfg, registry):
    with TestClient(create_app(cfg, models=registry)) as c:
        yield c


@pytest.fixture(scope="module")
def translator(checkpoint) -> Translator:
    """The same model, loaded apart: what the server must answer."""
    return Translator.from_checkpoint(checkpoint, device="cpu", nbest=3, **SEARCH)


@pytest.fixture(scope="module")
def texts(demo_corpus) -> list[str]:
    return (demo_corpus / "test.en").read_text(encoding="utf-8").splitlines()[:6]


def _error(response, status: int, *needles: str) -> str:
    assert response.status_code == status, response.text
    message = response.json()["error"]
    assert isinstance(message, str) and "\n" not in message
    for needle in needles:
        assert needle in message, (needle, message)
    return message


# -- LibreTranslate ---------------------------------------------------------------------


def test_languages_come_from_the_checkpoint(client):
    assert client.get("/languages").json() == [
        {"code": "en", "name": "English", "targets": ["de"]},
        {"code": "de", "name": "German", "targets": []},
    ]


def test_libretranslate_json_string_list_and_lines(client, translator, texts):
    want = translator.translate(texts)
    one = client.post("/translate", json={"q": texts[0], "source": "en", "target": "de"})
    assert one.status_code == 200 and one.json() == {"translatedText": want[0]}
    many = client.post("/translate", json={"q": texts[:3], "source": "en", "target": "de"})
    assert many.json() == {"translatedText": want[:3]}
    # each line is a sentence; the lines come back joined, empty ones kept
    lines = client.post(
        "/translate", json={"q": f"{texts[0]}\n\n{texts[1]}", "source": "en", "target": "de"}
    )
    assert lines.json()["translatedText"] == f"{want[0]}\n\n{want[1]}"


def test_libretranslate_form_multipart_and_query(client, translator, texts):
    want = translator.translate(texts[:2])
    form = client.post("/translate", data={"q": texts[0], "source": "en", "target": "de"})
    assert form.json() == {"translatedText": want[0]}
    multipart = client.post(
        "/translate",
        data={"q": texts[1], "source": "en", "target": "de"},
        files={"unused": ("x.txt", b"x")},
    )
    assert multipart.json() == {"translatedText": want[1]}
    query = client.post("/translate", params={"q": texts[0], "source": "en", "target": "de"})
    assert query.json() == {"translatedText": want[0]}
    crlf = client.post(  # a form's CRLF line ends are lines too, as LibreTranslate reads them
        "/translate", data={"q": f"{texts[0]}\r\n{texts[1]}", "source": "en", "target": "de"}
    )
    assert crlf.json() == {"translatedText": f"{want[0]}\n{want[1]}"}


def test_libretranslate_auto_and_alternatives(client, checkpoint, translator, texts):
    auto = client.post("/translate", json={"q": [texts[0]], "source": "auto", "target": "de"})
    assert auto.json()["detectedLanguage"] == [{"confidence": 100.0, "language": "en"}]
    got = client.post(
        "/translate", json={"q": texts[0], "source": "en", "target": "de", "alternatives": 2}
    ).json()
    best = translator.translate_batch([texts[0]], nbest=3)[0]
    assert got["translatedText"] == best[0].text
    assert got["alternatives"] == _distinct([t.text for t in best[1:]], best[0].text)[:2]
    # more alternatives than the beam holds: the beam grows to 6 for the request
    many = client.post(
        "/translate", data={"q": texts[1], "source": "en", "target": "de", "alternatives": "5"}
    ).json()
    wider = Translator.from_checkpoint(checkpoint, device="cpu", **{**SEARCH, "beam": 6})
    six = wider.translate_batch([texts[1]], nbest=6)[0]
    assert many["translatedText"] == six[0].text
    assert many["alternatives"] == _distinct([t.text for t in six[1:]], six[0].text)[:5]


def test_libretranslate_detect_names_the_one_source_language(client, texts):
    # LibreTranslate's web page and clients ask /detect before a source=auto translation
    answer = [{"confidence": 100.0, "language": "en"}]
    assert client.post("/detect", json={"q": texts[0]}).json() == answer
    assert client.post("/detect", data={"q": texts[0]}).json() == answer
    _error(client.post("/detect", json={}), 400, "Invalid request: missing q parameter")
    _error(client.post("/detect", json={"q": ["a", "b"]}), 400, "q: must be a string")


def test_detect_with_several_source_languages_asks_for_source(checkpoint, texts):
    cfg = _config(
        None,
        models=[
            ModelSpec(name="en-de", checkpoint=str(checkpoint)),
            ModelSpec(name="fr-de", checkpoint=str(checkpoint)),
        ],
    )
    models = ModelRegistry.load(cfg)
    models.models[1].translator.src_lang = "fr"  # stands for a French model: no detector can choose
    try:
        with TestClient(create_app(cfg, models=models)) as client:
            _error(
                client.post("/detect", json={"q": texts[0]}),
                400,
                "translates from en, fr and does not detect languages; give source=",
            )
            auto = {"q": texts[0], "source": "auto", "target": "de"}
            _error(client.post("/translate", json=auto), 400, "give source=")
            pair = {"q": texts[0], "source": "en", "target": "de"}
            assert client.post("/translate", json=pair).is_success  # still serving
    finally:
        models.close(30)


def _distinct(texts: list[str], best: str) -> list[str]:
    out: list[str] = []
    for t in texts:
        if t != best and t not in out:
            out.append(t)
    return out


def test_libretranslate_errors(client):
    cases = [
        ({"source": "en", "target": "de"}, "Invalid request: missing q parameter"),
        ({"q": "x", "target": "de"}, "Invalid request: missing source parameter"),
        ({"q": "x", "source": "en"}, "Invalid request: missing target parameter"),
        (
            {"q": "x", "source": "fr", "target": "de"},
            "source=fr, target=de: this pair is not served",
        ),
        ({"q": "x", "source": "en", "target": "de", "format": "html"}, "format=html"),
        ({"q": 5, "source": "en", "target": "de"}, "q: must be a string or a list of strings"),
        ({"q": ["a", 1], "source": "en", "target": "de"}, "q: must be a string or a list"),
        ({"q": "x", "source": "en", "target": "de", "alternatives": "x"}, "not a number"),
        ({"q": "x", "source": "en", "target": "de", "alternatives": 50}, "alternatives=50"),
    ]
    for body, needle in cases:
        _error(client.post("/translate", json=body), 400, needle)
    pair = _error(client.post("/translate", json=cases[3][0]), 400)
    assert "en->de" in pair  # the message names what is served
    _error(
        client.post("/translate", content=b'{"q": ', headers={"Content-Type": "application/json"}),
        400,
        "body: not valid JSON",
    )
    _error(
        client.post("/translate", content=b"[1, 2]", headers={"Content-Type": "application/json"}),
        400,
        "Invalid JSON format",
    )
    deep = b"[" * 1900 + b"]" * 1900  # deeper than Python's JSON parser recurses (1000)
    for path in ("/translate", "/v1/translate"):
        answer = client.post(path, content=deep, headers={"Content-Type": "application/json"})
        assert answer.status_code == 400 and "error" in answer.json(), answer.text


# -- limits -----------------------------------------------------------------------------


def test_over_a_limit_is_413(client):
    pair = {"source": "en", "target": "de"}
    _error(client.post("/translate", json={"q": "x" * 601, **pair}), 413, "601 characters", "600")
    _error(client.post("/translate", json={"q": ["one"] * 13, **pair}), 413, "13 sentences")
    _error(client.post("/translate", json={"q": "\n".join(["one"] * 13), **pair}), 413, "13")
    _error(client.post("/v1/translate", json={"texts": ["one"] * 13}), 413, "13 sentences")
    _error(
        client.post("/v1/score", json={"sources": ["one"], "targets": ["y" * 600]}),
        413,
        "characters",
    )
    big = b'{"q": "' + b"x" * 5000 + b'"}'
    _error(
        client.post("/translate", content=big, headers={"Content-Type": "application/json"}),
        413,
        "body: more than 4000 bytes",
    )
    chunked = client.post(  # no Content-Length: counted while read
        "/translate", content=iter([big[:3000], big[3000:]]), headers={"Content-Type": "text/plain"}
    )
    _error(chunked, 413, "body: more than 4000 bytes")
    assert client.post("/translate", json={"q": "one", **pair}).status_code == 200


# -- nmt's API --------------------------------------------------------------------------


def test_native_translate_equals_translate_batch(client, translator, texts):
    batch = [*texts[:4], ""]
    got = client.post(
        "/v1/translate",
        json={"texts": batch, "nbest": 3, "return_scores": True, "return_alignment": True},
    ).json()
    want = translator.translate_batch(batch, nbest=3, return_scores=True, return_alignment=True)
    found = [(text, t.text) for text, per in zip(batch, want) for t in per]
    tolerance = text_logprob_tolerance(translator, *zip(*found))  # tests/rounding.py
    assert got["model"] == "en-de" and got["warnings"] == []
    for result, per_text in zip(got["results"], want):
        assert len(result["translations"]) == len(per_text)
        for mine, theirs in zip(result["translations"], per_text):
            assert mine["text"] == theirs.text and mine["pieces"] == theirs.pieces
            assert mine["score"] == pytest.approx(theirs.score, abs=tolerance)  # lenpen 1
            assert mine["token_scores"] == pytest.approx(theirs.token_scores, abs=tolerance)
            assert [tuple(p) for p in mine["alignment"]] == theirs.alignment
    plain = client.post("/v1/translate", json={"texts": texts[:2]}).json()
    assert [r["translations"][0] for r in plain["results"]] == [
        {"text": t.text, "pieces": t.pieces} for t in (x[0] for x in want[:2])
    ]


def test_native_prefixes_and_search_options(client, checkpoint, translator, texts):
    prefixes = ["Sie", None, "zwei"]
    got = client.post("/v1/translate", json={"texts": texts[:3], "prefixes": prefixes}).json()
    want = translator.translate_batch(texts[:3], nbest=1, prefixes=prefixes)
    assert [r["translations"][0]["pieces"] for r in got["results"]] == [w[0].pieces for w in want]
    options = {"beam": 2, "lenpen": 0.5, "no_repeat_ngram_size": 2, "min_len": 2, "unkpen": 1.0}
    got = client.post("/v1/translate", json={"texts": texts, **options}).json()
    other = Translator.from_checkpoint(checkpoint, device="cpu", **{**SEARCH, **options}).translate(
        texts
    )
    assert [r["translations"][0]["text"] for r in got["results"]] == other


def test_native_sampling_is_reproducible(client, checkpoint, texts):
    body = {"texts": texts, "sampling": True, "seed": 3, "sampling_topk": 10}
    first = client.post("/v1/translate", json=body).json()["results"]
    second = client.post("/v1/translate", json=body).json()["results"]
    fresh = Translator.from_checkpoint(
        checkpoint, device="cpu", sampling=True, seed=3, sampling_topk=10, **SEARCH
    ).translate(texts)
    assert first == second
    assert [r["translations"][0]["text"] for r in first] == fresh


def test_native_attention_for_the_heatmap(client, translator, texts):
    got = client.post(
        "/v1/translate", json={"texts": [texts[0], ""], "return_attention": True}
    ).json()
    attention = got["results"][0]["attention"]
    best = translator.translate_batch([texts[0]], nbest=1)[0][0]
    assert attention["target"] == [*best.pieces, "</s>"]
    src = translator.src_tokenizer.encode_as_pieces(texts[0])
    assert attention["source"] == [*src, "</s>"]
    weights = attention["weights"]
    assert len(weights) == len(attention["target"])
    assert all(len(row) == len(attention["source"]) for row in weights)
    # weights rounded to 4 decimals: a row's sum moves by up to K * 5e-5
    assert all(sum(row) == pytest.approx(1.0, abs=len(row) * 5e-5 + 1e-6) for row in weights)
    assert got["results"][1]["attention"] == {"source": [], "target": [], "weights": []}


def test_score_equals_translator_score(client, checkpoint, texts, demo_corpus):
    texts = [texts[0], "", texts[2]]  # (an empty source is scored as [EOS])
    refs = (demo_corpus / "test.de").read_text(encoding="utf-8").splitlines()[:3]
    refs[2] = ""  # an empty target: p(EOS | source)
    for lenpen in (None, 0.5):
        answer = client.post(
            "/v1/score", json={"sources": texts, "targets": refs, "lenpen": lenpen}
        )
        assert answer.status_code == 200, answer.text
        got = answer.json()
        scorer = Translator.from_checkpoint(checkpoint, device="cpu", lenpen=lenpen or 1.0)
        tolerance = text_logprob_tolerance(scorer, texts, refs)  # tests/rounding.py
        for mine, theirs in zip(got["scores"], scorer.score(texts, refs)):
            each = theirs.token_scores
            assert mine["token_scores"] == pytest.approx(each, abs=tolerance)
            log_prob = sum_tolerance(each, tolerance, lenpen=0.0)
            assert mine["log_prob"] == pytest.approx(theirs.log_prob, abs=log_prob)
            score = sum_tolerance(each, tolerance, lenpen=lenpen or 1.0)
            assert mine["score"] == pytest.approx(theirs.score, abs=score)
            assert mine["pieces"] == theirs.pieces
    _error(client.post("/v1/score", json={"sources": ["a", "b"], "targets": ["c"]}), 400, "1 of")


def test_native_wrong_types_are_422_bad_values_400(client):
    for body, needle in (
        ({"texts": [1]}, "texts.0: "),
        ({"texts": "one"}, "texts: "),
        ({"texts": ["a"], "beam": "5"}, "beam: "),
        ({"texts": ["a"], "colour": 1}, "colour: "),
        ({"texts": ["a"], "use_cache": False}, "use_cache: "),  # the server's choice
        ({}, "texts: "),
    ):
        _error(client.post("/v1/translate", json=body), 422, needle)
    for body, needle in (
        ({"texts": ["a"], "beam": 0}, "beam=0: must be 1 or more; use 1 for greedy search"),
        ({"texts": ["a"], "nbest": 9}, "nbest=9: must be between 1 and beam=4"),
        ({"texts": ["a"], "temperature": 0.0}, "temperature=0.0: must be positive"),
        # min_len beyond every output: from the options, or from the model's positions
        ({"texts": ["a"], "min_len": 9, "max_len_a": 0, "max_len_b": 5}, "min_len=9: more than"),
        ({"texts": ["a"], "min_len": 2000, "max_len_b": 3000}, "model.max_target_positions=1024"),
        ({"texts": ["a"], "temperature": 1e-320, "sampling": True}, "temperature=1e-320: below"),
        ({"texts": ["a"], "lenpen": 400}, "lenpen=400.0: out of range"),
        ({"texts": ["a"], "seed": 10**30, "sampling": True}, f"seed={10**30}: out of range"),
        ({"texts": ["a"], "beam": 17}, "beam=17: more than this server's max_beam=16"),
        ({"texts": ["a"], "beam": 10**20}, "more than this server's max_beam=16"),
        ({"texts": ["a"], "prefixes": ["x", "y"]}, "prefixes: 2 of them for 1 texts"),
        ({"texts": ["a"], "source": "fr", "target": "de"}, "this pair is not served"),
        ({"texts": ["a"], "source": "en"}, "target=null: give source and target"),
    ):
        _error(client.post("/v1/translate", json=body), 400, needle)
    _error(client.post("/v1/translate", json={"texts": ["a"], "model": "xx"}), 404, "model=xx")
    _error(client.get("/nowhere"), 404, "/nowhere")
    _error(client.get("/translate"), 405)


# -- several models, the key, health, metrics, the page --------------------------------


def test_several_models_by_name(checkpoint, texts):
    cfg = _config(
        None,
        models=[
            ModelSpec(name="base", checkpoint=str(checkpoint)),
            ModelSpec(name="greedy", checkpoint=str(checkpoint), search={"beam": 1}),
            ModelSpec(name="sample", checkpoint=str(checkpoint), search={"sampling": True}),
        ],
    )
    models = ModelRegistry.load(cfg)
    try:
        with TestClient(create_app(cfg, models=models)) as client:
            listed = client.get("/v1/models").json()["models"]
            assert [(m["name"], m["search"]["beam"]) for m in listed] == [
                ("base", 4),
                ("greedy", 1),
                ("sample", 4),
            ]
            greedy = Translator.from_checkpoint(checkpoint, device="cpu", **{**SEARCH, "beam": 1})
            got = client.post("/v1/translate", json={"texts": texts, "model": "greedy"}).json()
            assert [r["translations"][0]["text"] for r in got["results"]] == greedy.translate(texts)
            # a sampling model: each request from the seed, whatever came before it
            sampled = Translator.from_checkpoint(
                checkpoint, device="cpu", **{**SEARCH, "sampling": True}
            ).translate(texts)
            for _ in range(2):
                got = client.post("/v1/translate", json={"texts": texts, "model": "sample"})
                assert [r["translations"][0]["text"] for r in got.json()["results"]] == sampled
            _error(client.post("/v1/translate", json={"texts": texts}), 400, "base, greedy")
            _error(client.post("/v1/translate", json={"texts": texts, "model": "x"}), 404, "greedy")
            lt = client.post("/translate", json={"q": texts[0], "source": "en", "target": "de"})
            base = Translator.from_checkpoint(checkpoint, device="cpu", **SEARCH)
            assert lt.json()["translatedText"] == base.translate(texts[:1])[0]  # the first
    finally:
        models.close(30)


def test_duplicate_model_names_are_refused(checkpoint):
    cfg = _config(None, models=[ModelSpec(checkpoint=str(checkpoint))] * 2)
    with pytest.raises(NmtError, match=r"^models\[1\]\.name=null: .* would be called en-de"):
        ModelRegistry.load(cfg)


def test_api_key(checkpoint, registry, texts):
    cfg = _config(checkpoint, api_key="s3cret")
    pair = {"source": "en", "target": "de"}
    with TestClient(create_app(cfg, models=registry)) as client:
        _error(client.post("/translate", json={"q": "one", **pair}), 403, "api_key")
        _error(client.post("/translate", json={"q": "one", "api_key": "nope", **pair}), 403)
        _error(client.post("/detect", json={"q": "one"}), 403, "api_key")
        assert client.post("/detect", data={"q": "one", "api_key": "s3cret"}).is_success
        assert client.post("/translate", json={"q": "one", "api_key": "s3cret", **pair}).is_success
        assert client.post("/translate", data={"q": "one", "api_key": "s3cret", **pair}).is_success
        assert client.post("/translate", json={"q": "one", "apiKey": "s3cret", **pair}).is_success
        _error(client.post("/v1/translate", json={"texts": ["one"]}), 403)
        bearer = {"Authorization": "Bearer s3cret"}
        assert client.post("/v1/translate", json={"texts": ["one"]}, headers=bearer).is_success
        assert (
            client.post("/v1/score", json={"sources": ["a"], "targets": ["b"]}).status_code == 403
        )
        for open_route in ("/languages", "/health", "/v1/models", "/"):
            assert client.get(open_route).status_code == 200
        assert client.get("/v1/models").json()["api_key_required"] is True


def test_health_and_metrics(client):
    assert client.get("/health").json() == {"status": "ok", "models": ["en-de"]}
    client.post("/translate", json={"q": ["one", "two"], "source": "en", "target": "de"})
    client.post("/translate", json={"source": "en", "target": "de"})
    text = client.get("/metrics").text
    for needle in (
        'nmt_serve_requests_total{route="/translate",status="200"}',
        'nmt_serve_requests_total{route="/translate",status="400"}',
        'nmt_serve_errors_total{kind="bad_request",route="/translate"}',
        'nmt_serve_request_seconds_bucket{le="0.005",route="/translate"}',
        'nmt_serve_batch_sentences_bucket{le="1.0",model="en-de"}',
        'nmt_serve_batch_seconds_count{model="en-de"}',
        'nmt_serve_sentences_total{model="en-de"}',
        'nmt_serve_queue_sentences{model="en-de"} 0.0',
        "nmt_serve_models_loaded 1.0",
        "nmt_serve_in_flight 1.0",  # the /metrics request itself
    ):
        assert needle in text, needle


def test_health_is_503_until_the_models_are_loaded(checkpoint, monkeypatch):
    from nmt.serving import app as app_module

    release = threading.Event()
    real_load = ModelRegistry.load

    def slow_load(cfg):
        release.wait(60)
        return real_load(cfg)

    monkeypatch.setattr(app_module.ModelRegistry, "load", staticmethod(slow_load))
    with TestClient(create_app(_config(checkpoint))) as client:
        assert client.get("/health").status_code == 503
        assert client.get("/health").json() == {"status": "loading"}
        _error(client.post("/v1/translate", json={"texts": ["one"]}), 503, "loading")
        assert client.get("/metrics").text.count("nmt_serve_models_loaded 0.0") == 1
        release.set()
        for _ in range(600):
            if client.get("/health").status_code == 200:
                break
            threading.Event().wait(0.1)
        assert client.get("/health").json()["status"] == "ok"
        assert client.post("/v1/translate", json={"texts": ["one"]}).status_code == 200


def test_a_failed_load_is_reported(tmp_path):
    broken = tmp_path / "broken.pt"
    broken.write_bytes(b"not a checkpoint")
    failures: list[BaseException] = []
    seen = threading.Event()

    def failed(exc: BaseException) -> None:
        failures.append(exc)
        seen.set()

    with TestClient(create_app(_config(broken), on_load_error=failed)) as client:
        assert seen.wait(60)
        health = client.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "failed"
        assert "broken.pt" not in health.text and str(tmp_path) not in health.text
    assert isinstance(failures[0], NmtError) and "broken.pt" in str(failures[0])


def test_the_web_page(client, cfg, registry):
    page = client.get("/")
    assert page.status_code == 200 and 'id="translate"' in page.text
    assert client.get("/static/app.js").status_code == 200
    off = ServeConfig(**{**cfg.__dict__, "web_page": False})
    with TestClient(create_app(off, models=registry)) as bare:
        assert bare.get("/").status_code == 404
        assert bare.get("/static/app.js").status_code == 404


def test_max_beam_bounds_every_request(cfg, registry, translator, texts):
    """A request's memory and time grow with its beam: max_beam bounds it, and with it
    LibreTranslate's alternatives (n alternatives need a beam of n + 1)."""
    narrow = ServeConfig(**{**cfg.__dict__, "max_beam": 4})
    pair = {"source": "en", "target": "de"}
    with TestClient(create_app(narrow, models=registry)) as client:
        _error(client.post("/v1/translate", json={"texts": ["a"], "beam": 5}), 400, "max_beam=4")
        three = client.post("/translate", json={"q": texts[0], "alternatives": 3, **pair})
        assert three.status_code == 200 and len(three.json()["alternatives"]) <= 3
        _error(client.post("/translate", json={"q": "a", "alternatives": 4, **pair}), 400, "4: ")
        assert client.get("/v1/models").json()["limits"]["max_beam"] == 4
    assert translator.search.beam == 4  # the model's own beam is within the limit


def test_a_request_over_its_timeout_is_503_and_the_server_goes_on(cfg, registry, texts):
    impatient = ServeConfig(**{**cfg.__dict__, "request_timeout": 1e-6})
    with TestClient(create_app(impatient, models=registry)) as client:
        late = client.post("/v1/translate", json={"texts": texts})
        _error(late, 503, "request_timeout=1e-06: not translated in time")
        assert late.headers["Retry-After"] == "1"
        assert 'kind="timeout"' in client.get("/metrics").text
    with TestClient(create_app(cfg, models=registry)) as client:
        assert client.post("/v1/translate", json={"texts": texts}).status_code == 200


def test_a_model_variant_shares_the_models_and_the_lock(translator):
    other = translator.with_search(translator.search.__class__(beam=2))
    assert other.models is translator.models and other._lock is translator._lock
    assert other.generator is not translator.generator and other.search.beam == 2
    assert translator.search.beam == 4  # the original keeps its own
    assert translator.src_lang == "en" and translator.tgt_lang == "de"
