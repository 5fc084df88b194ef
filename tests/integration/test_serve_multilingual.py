"""nmt-serve with a multilingual model, as a real process on a loopback port: /languages
lists each source language with the targets it has directions to, LibreTranslate's
/translate and nmt's /v1/translate translate into the language asked for, and answer what
Translator.translate(tgt_lang=) and nmt-generate tgt_lang= answer; sentences into
different languages share a batch without changing their translations; a language the
model does not know is a one-line 400 and the server keeps serving; the web page's
From/To pickers follow the model's directions (a real browser)."""

from __future__ import annotations

import io
import random
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

import httpx
import pytest
import sentencepiece as spm
import torch

from nmt import Translator
from nmt.checkpoint import save_checkpoint, tokenizer_to_tensor
from nmt.data.languages import LanguageTags, tag_piece
from nmt.data.tokenizer import Tokenizer
from nmt.model.config import ModelConfig
from nmt.model.transformer import Transformer
from nmt.vocab import SPECIAL_IDS
from tests.integration.serve_process import ServeProcess, nmt_generate
from tests.integration.test_serve_browser import CHROMEDRIVER, CHROMIUM, browser  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")

# the directions the model knows: no de<->fr, so each source has its own targets
DIRECTIONS = ["en-de", "de-en", "en-fr", "fr-en"]
SEARCH = dict(beam=4, max_len_a=1.0, max_len_b=5)  # serve_process.SEARCH_ARGS
WORDS = "one two three four five six seven eight nine ten red blue dog cat house".split()


def _sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6))) for _ in range(n)]


def multilingual_checkpoint(
    path: Path, directions: list[str], single: bool = False, seed: int = 0
) -> Path:
    """A random tiny Transformer with a joint SentencePiece model whose control symbols
    are the tags of the directions' languages; `single`: a single-pair checkpoint of the
    one direction (no tags, no data.languages)."""
    langs = list(dict.fromkeys(lang for d in directions for lang in d.split("-")))
    spm.set_random_generator_seed(1)
    model_bytes = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_sentences(300, 0)),
        model_writer=model_bytes,
        vocab_size=40,
        model_type="unigram",
        character_coverage=1.0,
        byte_fallback=False,
        control_symbols=[] if single else [tag_piece(lang) for lang in langs],
        bos_id=SPECIAL_IDS["bos"],
        pad_id=SPECIAL_IDS["pad"],
        eos_id=SPECIAL_IDS["eos"],
        unk_id=SPECIAL_IDS["unk"],
        num_threads=1,
        minloglevel=2,
    )
    tokenizer = Tokenizer.from_bytes(model_bytes.getvalue())
    torch.manual_seed(seed)
    cfg = ModelConfig(
        embed_dim=32,
        ffn_dim=64,
        attention_heads=4,
        encoder_layers=1,
        decoder_layers=2,
        dropout=0.0,
        max_source_positions=32,
        max_target_positions=32,
        share_all_embeddings=True,
    )
    model = Transformer(cfg, tokenizer.vocab_size, tokenizer.vocab_size)
    src, tgt = directions[0].split("-")
    data = {
        "src_lang": src,
        "tgt_lang": tgt,
        "src_vocab_size": tokenizer.vocab_size,
        "tgt_vocab_size": tokenizer.vocab_size,
        "joint_vocab": True,
        "special_ids": dict(SPECIAL_IDS),
        "normalization": {"nfkc": False},
    }
    if not single:
        pieces = {lang: tag_piece(lang) for lang in langs}
        processor = spm.SentencePieceProcessor(model_proto=tokenizer.model_bytes)
        ids = {lang: processor.piece_to_id(piece) for lang, piece in pieces.items()}
        data["languages"] = LanguageTags("tgt", ids, tuple(directions), pieces).to_dict()
    spm_tensor = tokenizer_to_tensor(tokenizer.model_bytes)
    save_checkpoint(
        {
            "format_version": 1,
            "model_config": asdict(cfg),
            "model": model.state_dict(),
            "data": data,
            "tokenizers": {"src": spm_tensor, "tgt": spm_tensor},
            "config": {},
        },
        path,
    )
    return path


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return multilingual_checkpoint(
        tmp_path_factory.mktemp("serve-multilingual") / "multi.pt", directions=DIRECTIONS
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
    return _sentences(12, 1)


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


def test_cli_api_and_server_agree_on_the_language_asked_for(
    server, translator, checkpoint, lines, tmp_path
):
    into_fr = translator.translate(lines, tgt_lang="fr")
    into_de = translator.translate(lines, tgt_lang="de")
    assert into_fr != into_de  # the tag is what picks the language
    assert nmt_generate(checkpoint, lines, tmp_path, "tgt_lang=fr") == into_fr
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
    _error(  # a source the model knows, a target it was not trained to reach from it
        httpx.post(f"{url}/translate", json={"q": "one", "source": "de", "target": "fr"}),
        "target=fr",
        "from de",
        "en",
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


def test_a_multilingual_and_a_single_pair_model_side_by_side(checkpoint, tmp_path, lines):
    single = multilingual_checkpoint(tmp_path / "de-fr.pt", ["de-fr"], single=True, seed=1)
    models = f"models=[{{name:multi,checkpoint:'{checkpoint}'}},{{checkpoint:'{single}'}}]"
    process = ServeProcess(None, models)
    try:
        url = process.url
        languages = {
            entry["code"]: entry["targets"] for entry in httpx.get(f"{url}/languages").json()
        }
        assert languages == {"en": ["de", "fr"], "de": ["en", "fr"], "fr": ["en"]}
        into_fr = Translator.from_checkpoint(single, device="cpu", **SEARCH).translate(lines[:2])
        pair = httpx.post(f"{url}/translate", json={"q": lines[:2], "source": "de", "target": "fr"})
        assert pair.json()["translatedText"] == into_fr  # the single-pair model
        native = httpx.post(
            f"{url}/v1/translate", json={"texts": lines[:2], "source": "de", "target": "en"}
        )
        assert native.json()["model"] == "multi"
        _error(  # the single-pair model refuses another target
            httpx.post(
                f"{url}/v1/translate", json={"texts": ["a"], "model": "de-fr", "tgt_lang": "en"}
            ),
            "tgt_lang=en: model de-fr translates fr",
        )
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

    browser.find_element(By.ID, "source").send_keys(lines[0])
    for lang in ("fr", "de"):
        target.select_by_value(lang)
        browser.find_element(By.ID, "translate").click()
        (want,) = translator.translate(lines[:1], tgt_lang=lang, src_lang="en")
        wait.until(
            lambda d, want=want: (
                [e.text for e in d.find_elements(By.CSS_SELECTOR, ".result li.best")]
                == [want.strip()]
            )
        )
