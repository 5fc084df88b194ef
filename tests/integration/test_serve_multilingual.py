"""nmt-serve with a multilingual model, as a real process on a loopback port: /languages
lists each source language with the targets it has directions to, LibreTranslate's
/translate and nmt's /v1/translate translate into the language asked for, and answer what
Translator.translate(tgt_lang=) and nmt-generate tgt_lang= answer; sentences into
different languages share a batch without changing their translations; a language the
model does not know is a one-line 400 and the server keeps serving; the web page's
From/To pickers follow the model's directions (a real browser)."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from nmt import Translator
from tests.integration.serve_process import ServeProcess, nmt_generate
from tests.integration.test_serve_browser import CHROMEDRIVER, CHROMIUM, browser  # noqa: F401
from tests.multilingual_checkpoint import multilingual_checkpoint, sentences

pytestmark = pytest.mark.usefixtures("one_thread")

# the directions the model knows: no de<->fr, so each source has its own targets
DIRECTIONS = ["en-de", "de-en", "en-fr", "fr-en"]
SEARCH = dict(beam=4, max_len_a=1.0, max_len_b=5)  # serve_process.SEARCH_ARGS


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return multilingual_checkpoint(
        tmp_path_factory.mktemp("serve-multilingual") / "multi.pt", directions=DIRECTIONS, seed=3
    )


@pytest.fixture(scope="module")
def server(checkpoint):
    process = ServeProcess(checkpoint, "max_wait_ms=300", "wait_gap_ms=100")
    yield process
    assert process.stop() == 0, process.output()


@pytest.fixture(scope="module")
def translator(checkpoint) -> Translator:
    """The same model, loaded apart: what the server must answer."""
    return Translator.from_checkpoint(checkpoint, device="cpu", **SEARCH)


@pytest.fixture(scope="module")
def lines() -> list[str]:
    return sentences("en", 12, 1)


def _error(response: httpx.Response, *needles: str) -> str:
    assert response.status_code == 400, response.text
    message = response.json()["error"]
    assert isinstance(message, str) and "\n" not in message
    for needle in needles:
        assert needle in message, (needle, message)
    return message


def _batches(url: str) -> tuple[float, float]:
    """(sentences, batches) decoded so far, from /metrics."""
    text = httpx.get(f"{url}/metrics").text
    found = dict(re.findall(r"^nmt_serve_batch_sentences_(sum|count)\{[^}]*\} (\S+)$", text, re.M))
    return float(found.get("sum", 0)), float(found.get("count", 0))


def test_languages_list_each_source_with_its_directions(server):
    assert httpx.get(f"{server.url}/languages").json() == [
        {"code": "en", "name": "English", "targets": ["de", "fr"]},
        {"code": "de", "name": "German", "targets": ["en"]},
        {"code": "fr", "name": "French", "targets": ["en"]},
    ]
    (model,) = httpx.get(f"{server.url}/v1/models").json()["models"]
    assert model["name"] == "en+de+fr"
    assert model["source"] is None and model["target"] is None
    assert model["languages"] == {"en": ["de", "fr"], "de": ["en"], "fr": ["en"]}
    assert httpx.get(f"{server.url}/health").json()["models"] == ["en+de+fr"]


def test_nmt_generate_and_the_server_agree(server, translator, checkpoint, lines, tmp_path):
    into_fr = translator.translate(lines, tgt_lang="fr")
    assert nmt_generate(checkpoint, lines, tmp_path, "tgt_lang=fr") == into_fr
    served = httpx.post(
        f"{server.url}/translate", json={"q": lines, "source": "en", "target": "fr"}
    )
    assert served.json() == {"translatedText": into_fr}


def test_the_api_and_the_server_agree_on_the_language_asked_for(server, translator, lines):
    into_fr = translator.translate(lines, tgt_lang="fr")
    into_de = translator.translate(lines, tgt_lang="de")
    assert into_fr != into_de  # the tag is what picks the language
    libre = httpx.post(f"{server.url}/translate", json={"q": lines, "source": "en", "target": "fr"})
    assert libre.json() == {"translatedText": into_fr}
    native = httpx.post(f"{server.url}/v1/translate", json={"texts": lines, "tgt_lang": "de"})
    assert [r["translations"][0]["text"] for r in native.json()["results"]] == into_de
    # the source language is optional (the tag names the target); target= is tgt_lang=
    named = httpx.post(
        f"{server.url}/v1/translate",
        json={"texts": lines, "source": "en", "target": "fr", "return_scores": True},
    ).json()["results"]
    want = translator.translate_batch(lines, tgt_lang="fr", src_lang="en", return_scores=True)
    for got, best in zip(named, want):
        assert got["translations"][0]["text"] == best[0].text
        assert got["translations"][0]["pieces"] == best[0].pieces  # no tag among them
        assert got["translations"][0]["score"] == pytest.approx(best[0].score, abs=1e-5)
    # source=auto: the one source language trained into the target (en -> fr only)
    auto = httpx.post(
        f"{server.url}/translate", json={"q": lines, "source": "auto", "target": "fr"}
    )
    assert auto.json() == {
        "translatedText": into_fr,
        "detectedLanguage": [{"confidence": 100.0, "language": "en"}] * len(lines),
    }
    # a direction it was not trained on, between languages it knows: zero-shot, as the
    # Translator does it (/languages lists the trained directions only)
    german = sentences("de", 3, 2)
    zero_shot = httpx.post(
        f"{server.url}/translate", json={"q": german, "source": "de", "target": "fr"}
    )
    want_zero_shot = translator.translate(german, tgt_lang="fr", src_lang="de")
    assert zero_shot.json() == {"translatedText": want_zero_shot}


def test_a_mixed_batch_translates_each_sentence_as_alone(server, translator, lines):
    targets = ["fr" if i % 3 else "de" for i in range(len(lines))]
    want = translator.translate(lines, tgt_lang=targets)
    # one request, one target per text: one batch of mixed languages
    mixed = httpx.post(f"{server.url}/v1/translate", json={"texts": lines, "tgt_lang": targets})
    assert [r["translations"][0]["text"] for r in mixed.json()["results"]] == want
    # each sentence alone
    for line, target, best in zip(lines[:4], targets, want):
        alone = httpx.post(
            f"{server.url}/translate", json={"q": line, "source": "en", "target": target}
        )
        assert alone.json()["translatedText"] == best
    # concurrent clients into different languages share batches, answers unchanged
    sentences_before, batches_before = _batches(server.url)

    def one(i: int) -> str:
        body = {"q": lines[i], "source": "en", "target": targets[i]}
        return httpx.post(f"{server.url}/translate", json=body, timeout=60).json()["translatedText"]

    with ThreadPoolExecutor(len(lines)) as pool:
        got = list(pool.map(one, range(len(lines))))
    assert got == want
    sentences, batches = _batches(server.url)
    assert sentences - sentences_before == len(lines)
    assert batches - batches_before < len(lines)  # some were decoded together


def test_a_language_the_model_does_not_know_is_a_400_and_serving_goes_on(server, lines):
    url = server.url
    _error(
        httpx.post(f"{url}/translate", json={"q": "one", "source": "en", "target": "xx"}),
        "target=xx",
        "de, fr",
    )
    _error(  # de and fr both translate into en, and no detector tells them apart
        httpx.post(f"{url}/translate", json={"q": "un", "source": "auto", "target": "en"}),
        "source=auto: de, fr all translate into en",
        "give source=",
    )
    _error(
        httpx.post(f"{url}/v1/translate", json={"texts": ["one"], "tgt_lang": "xx"}),
        "tgt_lang=xx",
        "en, de, fr",
    )
    _error(
        httpx.post(f"{url}/v1/translate", json={"texts": ["one", "two"], "tgt_lang": ["fr"]}),
        "tgt_lang: 1 language codes for 2 texts",
    )
    _error(  # a multilingual model needs to be told the target
        httpx.post(f"{url}/v1/translate", json={"texts": ["one"]}), "tgt_lang: required"
    )
    _error(
        httpx.post(
            f"{url}/v1/translate", json={"texts": ["one"], "target": "de", "tgt_lang": "fr"}
        ),
        "target=de, tgt_lang=fr: they differ",
    )
    _error(
        httpx.post(
            f"{url}/v1/score", json={"sources": ["one"], "targets": ["x"], "tgt_lang": "xx"}
        ),
        "tgt_lang=xx",
    )
    ok = httpx.post(f"{url}/translate", json={"q": lines[0], "source": "en", "target": "de"})
    assert ok.status_code == 200 and ok.json()["translatedText"]


def test_score_takes_the_target_language(server, translator, lines):
    targets = translator.translate(lines[:3], tgt_lang="fr")
    want = translator.score(lines[:3], targets, tgt_lang="fr")
    got = httpx.post(
        f"{server.url}/v1/score",
        json={"sources": lines[:3], "targets": targets, "tgt_lang": "fr"},
    ).json()["scores"]
    for g, w in zip(got, want):
        assert g["pieces"] == w.pieces
        assert g["log_prob"] == pytest.approx(w.log_prob, abs=1e-4)


def test_multilingual_and_single_pair_models_side_by_side(checkpoint, tmp_path, lines):
    """A tgt-tagged model, a single pair (de-fr) and a decoder-tagged model (every
    direction) in one server: /languages merges them, a trained direction picks its model,
    and the decoder's forced tag never shows in pieces or attention."""
    single = multilingual_checkpoint(tmp_path / "de-fr.pt", None, directions=["de-fr"], seed=1)
    decoder = multilingual_checkpoint(tmp_path / "decoder.pt", "decoder", seed=3)
    specs = [f"{{name:multi,checkpoint:'{checkpoint}'}}", f"{{checkpoint:'{single}'}}"]
    specs.append(f"{{name:dec,checkpoint:'{decoder}'}}")
    process = ServeProcess(None, f"models=[{','.join(specs)}]")
    try:
        url = process.url
        languages = {
            entry["code"]: entry["targets"] for entry in httpx.get(f"{url}/languages").json()
        }
        assert languages == {"en": ["de", "fr"], "de": ["en", "fr"], "fr": ["de", "en"]}
        into_fr = Translator.from_checkpoint(single, device="cpu", **SEARCH).translate(lines[:2])
        pair = httpx.post(f"{url}/translate", json={"q": lines[:2], "source": "de", "target": "fr"})
        assert pair.json()["translatedText"] == into_fr  # the single-pair model's
        native = httpx.post(
            f"{url}/v1/translate", json={"texts": lines[:2], "source": "de", "target": "en"}
        )
        assert native.json()["model"] == "multi"  # the first trained on de-en
        from_fr = httpx.post(f"{url}/translate", json={"q": "un", "source": "fr", "target": "de"})
        assert from_fr.is_success  # only dec was trained on fr-de
        _error(  # the single-pair model refuses another target
            httpx.post(
                f"{url}/v1/translate", json={"texts": ["a"], "model": "de-fr", "tgt_lang": "en"}
            ),
            "tgt_lang=en: model de-fr translates fr",
        )

        targets = ["fr", "de", "en"]
        texts = lines[:3]
        want = Translator.from_checkpoint(decoder, device="cpu", **SEARCH).translate_batch(
            texts, tgt_lang=targets, return_scores=True
        )
        got = httpx.post(
            f"{url}/v1/translate",
            json={
                "texts": texts,
                "model": "dec",
                "tgt_lang": targets,
                "return_scores": True,
                "return_attention": True,
            },
        ).json()["results"]
        for result, best in zip(got, want):
            translation = result["translations"][0]
            assert translation["text"] == best[0].text
            assert translation["pieces"] == best[0].pieces
            assert translation["score"] == pytest.approx(best[0].score, abs=1e-5)
            attention = result["attention"]
            assert attention["target"] == [*best[0].pieces, "</s>"]  # no tag row
            assert not any(p.startswith("<2") for p in attention["source"])
    finally:
        assert process.stop() == 0, process.output()


@pytest.mark.skipif(CHROMIUM is None or CHROMEDRIVER is None, reason="needs Debian's chromium")
def test_the_page_picks_the_target_language(server, translator, browser, lines):  # noqa: F811
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    wait = WebDriverWait(browser, 60)
    browser.get(server.url + "/")
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#tgt-lang option"))
    source, target = (
        Select(browser.find_element(By.ID, "src-lang")),
        Select(browser.find_element(By.ID, "tgt-lang")),
    )

    def values(select: Select) -> list[str]:
        return [o.get_attribute("value") for o in select.options]

    assert values(source) == ["", "en", "de", "fr"]  # "any", then the sources
    assert values(target) == ["de", "fr", "en"]
    assert target.options[1].text == "French (fr)"  # named as /languages names it
    source.select_by_value("de")
    assert values(target) == ["en"]  # the directions from German
    source.select_by_value("en")
    assert values(target) == ["de", "fr"]

    def shown(driver) -> list[str]:  # read at once: the page redraws its results
        return driver.execute_script(
            "return [...document.querySelectorAll('.result li.best')]"
            ".map((e) => e.textContent.trim())"
        )

    # a line whose translations into fr and de differ, so each answer shows which it was
    into = {
        lang: translator.translate(lines, tgt_lang=lang, src_lang="en") for lang in ("fr", "de")
    }
    line, want_fr, want_de = next(t for t in zip(lines, into["fr"], into["de"]) if t[1] != t[2])
    browser.find_element(By.ID, "source").send_keys(line)
    for lang, want in (("fr", want_fr), ("de", want_de)):
        target.select_by_value(lang)
        browser.find_element(By.ID, "translate").click()
        wait.until(lambda d, want=want: shown(d) == [want.strip()])
