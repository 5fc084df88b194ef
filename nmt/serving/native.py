"""nmt's own API, with every generation option:

    POST /v1/translate  {texts, model | source+target, src_lang, tgt_lang, prefixes,
                         constraints, glossary, nbest, return_scores, return_alignment,
                         return_attention, beam, lenpen, sampling, ...}
                     -> {model, results: [{translations: [{text, pieces, score, token_scores,
                         alignment, constraints_met}], attention: {source, target,
                         weights}}], warnings}
    POST /v1/score      {sources, targets, model | source+target, src_lang, tgt_lang, lenpen}
                     -> {model, scores: [{log_prob, score, token_scores, pieces}]}
    GET  /v1/models  -> {models: [{name, source, target, languages, search}],
                         api_key_required, limits}

`tgt_lang` (one code, or one per text) picks a multilingual model's target language (its
tag, per sentence: texts into different languages share batches), `src_lang` its source
language (optional unless its tags name the source); `target`/`source` are the same in
LibreTranslate's names, and with no model named they pick the model (the first that
translates them). A single-pair model takes them when they are its own. A language the
model does not know is a 400 naming the ones it knows.

A text is one sentence, as for Translator.translate_batch, and the answers equal its
answers: the search options a request may give are SearchConfig's (but use_cache, the
server's choice), made into the request's search as a Translator call makes its own.
`constraints` and `glossary` are translate_batch's too (the glossary a JSON object, over
the model's own from the serve config); with either, each translation says whether it
met its constraints (`constraints_met`), and `warnings` names each text whose best
translation could not. Wrong types and non-finite numbers (NaN, Infinity) are 422,
malformed JSON, text that is not UTF-8 (a lone surrogate) and bad constraints or glossary
400, limits 413 (`{"error": message}`). The API key is the
body's api_key, the query string's, or an `Authorization: Bearer KEY` header.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Optional, Union

from fastapi import APIRouter, Header, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, create_model

from nmt.generation.config import SEARCH_OPTIONS, SearchConfig
from nmt.serving.errors import bad_request, check_text
from nmt.serving.service import (
    Route,
    Service,
    json_chars,
    request_constraints,
    request_glossary,
    translations_of,
)

# The search options a request may give: every one but use_cache, which changes how fast
# the server decodes, not what it answers.
REQUEST_SEARCH_OPTIONS = tuple(k for k in SEARCH_OPTIONS if k != "use_cache")

_PHRASES: dict[str, Any] = {"type": "array", "items": {"type": "string"}}
CONSTRAINTS_SCHEMA: dict[str, Any] = {  # one text's entry of `constraints`, for /docs
    "anyOf": [
        _PHRASES,
        {"type": "object", "properties": {"include": _PHRASES, "exclude": _PHRASES}},
        {"type": "null"},
    ]
}


class _Body(BaseModel):
    # NaN and Infinity (which JSON parsers accept) are refused in every number (a 422)
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    model: Optional[str] = Field(None, description="the model's name; or give source and target")
    source: Optional[str] = Field(None, description="source language code")
    target: Optional[str] = Field(None, description="target language code")
    src_lang: Optional[str] = Field(
        None,
        description="source language code (as source); optional unless the model's tags need it",
    )
    tgt_lang: Optional[Union[str, list[str]]] = Field(
        None,
        description="target language code (as target), or one per text: a multilingual "
        "model translates each text into its own",
    )
    api_key: Optional[str] = Field(None, description="the server's API key, when it has one")


def _search_fields() -> dict[str, Any]:
    """Each request search option as an optional field of SearchConfig's type."""
    types = typing.get_type_hints(SearchConfig)
    return {
        name: (Optional[types[name]], Field(None, description="the model's when left out"))
        for name in REQUEST_SEARCH_OPTIONS
    }


_SearchOptions: Any = create_model("SearchOptions", __base__=_Body, **_search_fields())


class TranslateBody(_SearchOptions):
    """POST /v1/translate. Search options left out are the model's (GET /v1/models)."""

    texts: list[str] = Field(description="sentences to translate, one per text")
    prefixes: Optional[list[Optional[str]]] = Field(
        None, description="per text, a target prefix to force (null: none)"
    )
    # checked by parse_constraints and Glossary.of (a 400 naming the entry), not by types
    constraints: Any = Field(
        None,
        description='per text, phrases its translation must contain (["a", "b"]), or '
        '{"include": [...], "exclude": [...]} (phrases it must not contain), or null',
        json_schema_extra={"type": "array", "items": CONSTRAINTS_SCHEMA},
    )
    glossary: Any = Field(
        None,
        description="source term -> target term: the target term of each term found in a "
        "text must be in its translation (over the model's own glossary)",
        json_schema_extra={"type": "object", "additionalProperties": {"type": "string"}},
    )
    return_scores: bool = Field(False, description="scores per translation and per piece")
    return_alignment: bool = Field(False, description="(source, target) piece alignments")
    return_attention: bool = Field(
        False, description="the best translation's cross-attention (for heatmaps)"
    )


class ScoreBody(_Body):
    """POST /v1/score: the model's log-probability of each target given its source."""

    sources: list[str]
    targets: list[str]
    lenpen: Optional[float] = None


def router(service: Service) -> APIRouter:
    routes = APIRouter(prefix="/v1")

    @routes.get("/models")
    async def models() -> JSONResponse:
        cfg = service.cfg
        return JSONResponse(
            {
                "models": [m.describe() for m in service.registry().models],
                "api_key_required": cfg.api_key is not None,
                "limits": {
                    "max_request_chars": cfg.max_request_chars,
                    "max_request_sentences": cfg.max_request_sentences,
                    "max_beam": cfg.max_beam,
                },
            }
        )

    @routes.post("/translate")
    async def translate(
        body: TranslateBody, request: Request, authorization: Optional[str] = Header(None)
    ) -> JSONResponse:
        _check(service, body, request, authorization)
        chars = json_chars([body.prefixes, body.constraints, body.glossary])
        service.check_size("texts", body.texts, extra_chars=chars)
        constraints = request_constraints(body.constraints, len(body.texts))
        glossary = request_glossary(body.glossary)
        route = _route(service, body, len(body.texts))
        model = route.model
        search = service.search(model, {k: getattr(body, k) for k in REQUEST_SEARCH_OPTIONS})
        pieces = service.source_pieces[model.name] if body.return_attention else None
        answer = await service.translate(
            model,
            body.texts,
            translations_of(body.return_scores, body.return_alignment, pieces),
            search=search,
            prefixes=body.prefixes,
            constraints=constraints,
            glossary=glossary,
            alignment=body.return_alignment or body.return_attention,
            src_lang=route.src_lang,
            tgt_lang=route.tgt_lang,
        )
        return JSONResponse(
            {"model": model.name, "results": answer.value, "warnings": answer.warnings}
        )

    @routes.post("/score")
    async def score(
        body: ScoreBody, request: Request, authorization: Optional[str] = Header(None)
    ) -> JSONResponse:
        _check(service, body, request, authorization)
        service.check_size("sources", body.sources, extra_chars=sum(map(len, body.targets)))
        route = _route(service, body, len(body.sources))
        model = route.model
        search = service.search(model, {"lenpen": body.lenpen})
        answer = await service.score(
            model,
            body.sources,
            body.targets,
            search,
            src_lang=route.src_lang,
            tgt_lang=route.tgt_lang,
        )
        scores = [dataclasses.asdict(s) for s in answer.value]
        return JSONResponse({"model": model.name, "scores": scores, "warnings": answer.warnings})

    return routes


def _route(service: Service, body: _Body, texts: int) -> Route:
    """The request's model and languages: `src_lang`/`tgt_lang`, or `source`/`target`
    (the same, in LibreTranslate's names; both given, they must agree)."""
    langs = []
    for new, old in (("src_lang", "source"), ("tgt_lang", "target")):
        given, alias = getattr(body, new), getattr(body, old)
        if given is not None and alias is not None and given != alias:
            raise bad_request(f"{old}={alias}, {new}={given}: they differ; give one of them")
        langs.append((old, alias) if given is None and alias is not None else (new, given))
    (src_key, source), (tgt_key, target) = langs
    if target is None and src_key == "source":
        tgt_key = "target"  # named as the request named its source
    if isinstance(target, list) and len(target) != texts:
        raise bad_request(
            f"tgt_lang: {len(target)} language codes for {texts} texts; give one code for all "
            "texts or one per text"
        )
    return service.find(body.model, source, target, keys=(src_key, tgt_key))


def _check(service: Service, body: _Body, request: Request, authorization: str | None) -> None:
    """The body's text (a 400 for what is not UTF-8 text), then the API key: the body's
    api_key, else the query string's, else a Bearer token."""
    check_text(dict(body))
    service.check_key(body.api_key or request.query_params.get("api_key"), authorization)
