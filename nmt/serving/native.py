"""nmt's own API, with every generation option:

    POST /v1/translate  {texts, model | source+target, prefixes, nbest, return_scores,
                         return_alignment, return_attention, beam, lenpen, sampling, ...}
                     -> {model, results: [{translations: [{text, pieces, score, token_scores,
                         alignment}], attention: {source, target, weights}}], warnings}
    POST /v1/score      {sources, targets, model | source+target, lenpen}
                     -> {model, scores: [{log_prob, score, token_scores, pieces}]}
    GET  /v1/models  -> {models: [{name, source, target, search}], api_key_required, limits}

A text is one sentence, as for Translator.translate_batch, and the answers equal its
answers. Wrong types are 422, malformed JSON 400, limits 413 (`{"error": message}`).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from fastapi import APIRouter, Header
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from nmt.serving.config import SEARCH_KEYS
from nmt.serving.service import Service, translations_of


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    model: Optional[str] = Field(None, description="the model's name; or give source and target")
    source: Optional[str] = Field(None, description="source language code")
    target: Optional[str] = Field(None, description="target language code")
    api_key: Optional[str] = Field(None, description="the server's API key, when it has one")


class TranslateBody(_Body):
    """POST /v1/translate. Search options left out are the model's."""

    texts: list[str] = Field(description="sentences to translate, one per text")
    prefixes: Optional[list[Optional[str]]] = Field(
        None, description="per text, a target prefix to force (null: none)"
    )
    nbest: Optional[int] = Field(None, description="translations per text (at most beam)")
    return_scores: bool = Field(False, description="scores per translation and per piece")
    return_alignment: bool = Field(False, description="(source, target) piece alignments")
    return_attention: bool = Field(
        False, description="the best translation's cross-attention (for heatmaps)"
    )
    beam: Optional[int] = None
    lenpen: Optional[float] = None
    max_len_a: Optional[float] = None
    max_len_b: Optional[int] = None
    min_len: Optional[int] = None
    unkpen: Optional[float] = None
    no_repeat_ngram_size: Optional[int] = None
    sampling: Optional[bool] = None
    sampling_topk: Optional[int] = None
    sampling_topp: Optional[float] = None
    temperature: Optional[float] = None
    seed: Optional[int] = None


class ScoreBody(_Body):
    """POST /v1/score: the model's log-probability of each target given its source."""

    sources: list[str]
    targets: list[str]
    lenpen: Optional[float] = None


OVERRIDABLE = tuple(k for k in SEARCH_KEYS if k in TranslateBody.model_fields and k != "nbest")


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
        body: TranslateBody, authorization: Optional[str] = Header(None)
    ) -> JSONResponse:
        service.check_key(body.api_key or _bearer(authorization))
        chars = sum(len(p) for p in body.prefixes or [] if p)
        service.check_size("texts", body.texts, extra_chars=chars)
        model = service.find(body.model, body.source, body.target)
        search = service.search(model, {k: getattr(body, k) for k in OVERRIDABLE})
        pieces = service.source_pieces[model.name] if body.return_attention else None
        answer = await service.translate(
            model,
            body.texts,
            translations_of(body.return_scores, body.return_alignment, pieces),
            search=search,
            prefixes=body.prefixes,
            nbest=body.nbest,
            alignment=body.return_alignment or body.return_attention,
        )
        return JSONResponse(
            {"model": model.name, "results": answer.value, "warnings": answer.warnings}
        )

    @routes.post("/score")
    async def score(body: ScoreBody, authorization: Optional[str] = Header(None)) -> JSONResponse:
        service.check_key(body.api_key or _bearer(authorization))
        service.check_size("sources", body.sources, extra_chars=sum(map(len, body.targets)))
        model = service.find(body.model, body.source, body.target)
        search = service.search(model, {"lenpen": body.lenpen})
        answer = await service.score(model, body.sources, body.targets, search)
        scores = [dataclasses.asdict(s) for s in answer.value]
        return JSONResponse({"model": model.name, "scores": scores, "warnings": answer.warnings})

    return routes


def _bearer(authorization: str | None) -> str | None:
    if authorization and authorization.lower().startswith("bearer "):
        return authorization[7:].strip()
    return None
