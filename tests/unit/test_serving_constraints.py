"""Constraints and glossaries through nmt-serve, in-process (FastAPI's TestClient) on the
tiny trained checkpoint: nmt's API and LibreTranslate's answer what Translator.translate_batch
answers with the same constraints and glossary (CLI = API = server), a request without them
answers as before, bad ones are a 400 naming the entry and the server goes on, a model's
glossary from the serve config goes under each request's, and jobs with and without
constraints share batches without changing a translation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from nmt import Translator
from nmt.errors import NmtError
from nmt.generation.encoding import target_ids
from nmt.generation.terminology import Glossary, TextConstraints
from nmt.serving import ModelSpec, ServeConfig, create_app
from nmt.serving.batching import BatchQueue, Job
from nmt.serving.models import ModelRegistry, read_glossaries

pytestmark = pytest.mark.usefixtures("one_thread")

SEARCH = dict(beam=4, max_len_a=1.0, max_len_b=5)
PAIR = {"source": "en", "target": "de"}
# per text: phrases to include, include and exclude, none, none
CONSTRAINTS = [["Tische"], {"include": ["Anna"], "exclude": ["will"]}, None, []]
GLOSSARY = {"chairs": "Stühle", "kitchen": "Küchen"}
SERVER_TERMS = "tables\tTische\nchairs\tSessel\n"  # the request's "chairs" wins over it


def _config(checkpoint: Path, **kw) -> ServeConfig:
    return ServeConfig(checkpoint=str(checkpoint), device="cpu", max_wait_ms=5.0, **SEARCH, **kw)


@pytest.fixture(scope="module")
def translator(tiny_trained_checkpoint) -> Translator:
    """The server's model, loaded apart: what the server must answer."""
    return Translator.from_checkpoint(tiny_trained_checkpoint, device="cpu", **SEARCH)


@pytest.fixture(scope="module")
def client(tiny_trained_checkpoint):
    cfg = _config(tiny_trained_checkpoint)
    registry = ModelRegistry.load(cfg)
    with TestClient(create_app(cfg, models=registry)) as c:
        yield c
    registry.close(30)


@pytest.fixture(scope="module")
def server_glossary(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("serve-glossary") / "terms.tsv"
    path.write_text(SERVER_TERMS, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def glossary_client(tiny_trained_checkpoint, server_glossary):
    """A server whose model has a glossary in its serve config."""
    cfg = _config(tiny_trained_checkpoint, glossary=str(server_glossary))
    registry = ModelRegistry.load(cfg)
    with TestClient(create_app(cfg, models=registry)) as c:
        yield c
    registry.close(30)


@pytest.fixture(scope="module")
def texts(demo_corpus) -> list[str]:
    return (demo_corpus / "test.en").read_text(encoding="utf-8").splitlines()[:4]


def _translate(client: TestClient, **body) -> dict:
    answer = client.post("/v1/translate", json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()


def _best(answer: dict) -> list[dict]:
    return [result["translations"][0] for result in answer["results"]]


def _error(response, status: int, *needles: str) -> str:
    assert response.status_code == status, response.text
    message = response.json()["error"]
    assert isinstance(message, str) and "\n" not in message
    for needle in needles:
        assert needle in message, (needle, message)
    return message


# -- nmt's API --------------------------------------------------------------------------


def test_native_constraints_and_glossary_equal_the_translator(client, translator, texts):
    """The server's translations, n-best lists and constraints_met are Translator's with
    the same constraints and glossary; a met constraint is in the translation."""
    answer = _translate(
        client, texts=texts, constraints=CONSTRAINTS, glossary=GLOSSARY, nbest=2, **PAIR
    )
    want = translator.translate_batch(texts, constraints=CONSTRAINTS, glossary=GLOSSARY, nbest=2)
    got = [
        [(t["text"], t["pieces"], t["constraints_met"]) for t in result["translations"]]
        for result in answer["results"]
    ]
    assert got == [[(t.text, t.pieces, t.constraints_met) for t in per] for per in want]
    best = _best(answer)
    for phrase, translation in (("Tische", best[0]), ("Anna", best[1])):
        assert not translation["constraints_met"] or phrase in translation["text"]
    unmet = [i for i, t in enumerate(best) if not t["constraints_met"]]
    assert [w.split(":")[:2] for w in answer["warnings"]] == [["texts", str(i + 1)] for i in unmet]


def test_a_request_without_constraints_answers_as_before(client, translator, texts):
    """No constraints, no glossary: the answer has no constraints_met and is translate_batch's
    unconstrained one; null constraints for every text translate the same."""
    plain = _translate(client, texts=texts, return_scores=True)
    want = translator.translate_batch(texts, return_scores=True)
    assert [t["text"] for t in _best(plain)] == [per[0].text for per in want]
    assert all(set(t) == {"text", "pieces", "score", "token_scores"} for t in _best(plain))
    assert plain["warnings"] == []
    nulls = _translate(client, texts=texts, constraints=[None] * len(texts), return_scores=True)
    for free, constrained in zip(_best(plain), _best(nulls)):
        assert constrained == {**free, "constraints_met": True}


def test_an_unmet_constraint_is_reported(client, translator, texts):
    """A phrase longer than the length limit allows (source length + 5): the best
    translation without it, constraints_met false, and a warning naming the text."""
    short = [texts[0], "Anna sold tables."]
    too_long = [" ".join(["Küchenlampen Autofenster Stühle Tische Küchenfenster"] * 3)]
    answer = _translate(client, texts=short, constraints=[None, too_long])
    want = translator.translate_batch(short, constraints=[None, too_long])
    assert [t["text"] for t in _best(answer)] == [per[0].text for per in want]
    assert [t["constraints_met"] for t in _best(answer)] == [True, False]
    assert want[1][0].constraints_met is False
    assert len(answer["warnings"]) == 1 and answer["warnings"][0].startswith("texts:2: ")
    # an empty text cannot meet an include phrase either: one empty translation, noted
    empty = _translate(client, texts=["", texts[0]], constraints=[["Tische"], None])
    assert _best(empty)[0] == {"text": "", "pieces": [], "constraints_met": False}
    assert empty["warnings"] == ["texts:1: an empty text, so its include phrases could not be met"]


@pytest.mark.parametrize(
    "body, needles",
    [
        (dict(constraints="Tische"), ["constraints: not a list"]),
        (dict(constraints=[["Tische"]]), ["constraints: 1 of them for 2 texts"]),
        (dict(constraints=[None, 5]), ["constraints[1]: a number (5)"]),
        (dict(constraints=[["Tische", 5], None]), ["constraints[0]: item 2 is a number"]),
        (
            dict(constraints=[None, {"include": ["a"], "exlude": ["b"]}]),
            ['constraints[1]: unknown key "exlude"'],
        ),
        (dict(constraints=[None, {"include": "Tische"}]), ['constraints[1]: "include"']),
        (dict(constraints=[[" "], None]), ["constraints[0]: item 1 is an empty phrase"]),
        (dict(glossary=["chairs", "Stühle"]), ["glossary: not a JSON object"]),
        (dict(glossary={"chairs": 5}), ['glossary["chairs"]: the target term is a number']),
        (dict(glossary={"chairs": ""}), ['glossary["chairs"]: an empty target term']),
        (
            dict(constraints=[None, ["Tische"]], sampling=True),
            ["constraints[1]: constraints (a glossary's terms too) need beam search"],
        ),
        (dict(glossary={"tables": "Tische"}, sampling=True), ["texts:1: constraints"]),
    ],
)
def test_bad_constraints_are_400_and_the_server_goes_on(client, texts, body, needles):
    _error(client.post("/v1/translate", json={"texts": texts[:2], **body}), 400, *needles)
    assert _translate(client, texts=texts[:2], constraints=[["Tische"], None])["results"]


def test_constraints_count_towards_the_request_size(client, texts):
    long = ["x" * 5000, "y" * 5000]  # max_request_chars=10000 with the texts
    _error(
        client.post("/v1/translate", json={"texts": texts[:1], "constraints": [long]}),
        413,
        "characters, more than this server takes",
    )


# -- LibreTranslate ---------------------------------------------------------------------


def test_libretranslate_glossary_json_form_and_lists(client, translator, texts):
    """glossary as a JSON object, as a form's JSON string, and over a list q (each text
    gets it); left out, the answer is LibreTranslate's as before."""
    want = translator.translate(texts, glossary=GLOSSARY)
    assert want != translator.translate(texts)  # the glossary's terms change translations
    one = client.post("/translate", json={"q": texts[0], "glossary": GLOSSARY, **PAIR})
    assert one.json() == {"translatedText": want[0]}
    many = client.post("/translate", json={"q": texts, "glossary": GLOSSARY, **PAIR})
    assert many.json() == {"translatedText": want}
    form = client.post(
        "/translate",
        data={"q": f"{texts[3]}\n{texts[0]}", "glossary": json.dumps(GLOSSARY), **PAIR},
    )
    assert form.json() == {"translatedText": f"{want[3]}\n{want[0]}"}
    plain = client.post("/translate", json={"q": texts, **PAIR})
    assert plain.json() == {"translatedText": translator.translate(texts)}


@pytest.mark.parametrize(
    "glossary, needle",
    [
        ("{not json", "glossary={not json: not JSON"),
        ('["a", "b"]', "glossary: not a JSON object"),
        ('{"a": "\\ud800"}', "glossary.a: not text"),
    ],
)
def test_libretranslate_bad_glossary_is_400(client, texts, glossary, needle):
    _error(
        client.post("/translate", data={"q": texts[0], "glossary": glossary, **PAIR}), 400, needle
    )
    assert client.post("/translate", data={"q": texts[0], **PAIR}).status_code == 200


# -- the serve config's glossary --------------------------------------------------------


def test_the_models_glossary_goes_under_the_requests(
    glossary_client, translator, server_glossary, texts
):
    """Every request gets the model's glossary; a request's own term wins over it."""
    server = Glossary.read(str(server_glossary))
    plain = _best(_translate(glossary_client, texts=texts))
    assert [t["text"] for t in plain] == translator.translate(texts, glossary=server)
    own = _best(_translate(glossary_client, texts=texts, glossary={"chairs": "Stühle"}))
    merged = Glossary.merged(Glossary.of({"chairs": "Stühle"}), server)
    assert [t["text"] for t in own] == translator.translate(texts, glossary=merged)
    # texts[0] has "tables", texts[3] "chairs": the server's term, then the request's
    assert [t["constraints_met"] for t in plain + own] == [True] * 8
    assert "Tische" in plain[0]["text"] and "Tische" in own[0]["text"]
    assert "Sessel" in plain[3]["text"] and "Stühle" in own[3]["text"]
    libre = glossary_client.post("/translate", json={"q": texts, **PAIR}).json()
    assert libre == {"translatedText": translator.translate(texts, glossary=server)}


def test_a_glossary_file_is_read_and_checked_before_the_models(tmp_path):
    bad = tmp_path / "bad.tsv"
    bad.write_text("tables\tTische\nchairs without a tab\n", encoding="utf-8")
    cfg = ServeConfig(checkpoint=str(tmp_path / "never-loaded.pt"), glossary=str(bad))
    with pytest.raises(NmtError) as exc:
        read_glossaries(cfg)
    assert str(bad) in str(exc.value) and "2" in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize(
    "options, message",
    [
        (
            dict(glossary="a.tsv", models=[ModelSpec("a.pt")]),
            "glossary=a.tsv: given together with models=; give each model its own glossary",
        ),
        (dict(checkpoint="a.pt", glossary=" "), "glossary=' ': empty; give a TSV file"),
        (
            dict(models=[ModelSpec("a.pt", glossary="")]),
            "models[0].glossary='': empty; give a TSV file",
        ),
    ],
)
def test_glossary_options_are_checked(options, message):
    with pytest.raises(NmtError) as exc:
        ServeConfig(**options).validate()
    assert str(exc.value).startswith(message) and "\n" not in str(exc.value)


# -- batching ---------------------------------------------------------------------------


def test_jobs_with_and_without_constraints_share_a_batch(translator, texts):
    """A constrained job and a free one queued together are decoded in one batch, and
    each gets exactly what Translator.translate_batch gives it alone."""
    batches: list[int] = []
    queue = BatchQueue(
        "test", max_sentences=16, max_wait=0.5, on_batch=lambda n, s: batches.append(n)
    )
    constraints = [
        TextConstraints(include=("Tische",)),
        None,
        TextConstraints(exclude=("will",)),
        None,
    ]
    try:
        constrained = Job(
            translator, texts=texts, constraints=constraints, glossary=Glossary.of(GLOSSARY)
        )
        free = Job(translator, texts=texts)
        with queue._cond:  # queued together: the worker sees both at once
            futures = [queue.submit(constrained), queue.submit(free)]
        got = [future.result(timeout=120) for future in futures]
    finally:
        queue.close(30)
    assert batches == [2 * len(texts)]
    for results, options in zip(got, [dict(constraints=constraints, glossary=GLOSSARY), {}]):
        want = translator.translate_batch(texts, **options)
        assert [translator.pieces(target_ids(h[0])) for h in results] == [
            per[0].pieces for per in want
        ]
