"""LibreTranslate's API, as its clients call it: POST /translate, POST /detect, GET /languages.

    POST /translate  q (a string, or a list of strings), source (a code or "auto"), target,
                     format ("text"), alternatives (n), api_key, and nmt's own glossary
                     (source term -> target term, for every text); as a JSON body, or
                     form-encoded (application/x-www-form-urlencoded or multipart), or in the
                     query string; the key may also come as `Authorization: Bearer KEY`
                  -> {"translatedText": str | [str]} (+ "alternatives", "detectedLanguage")
    POST /detect     q (a string), api_key
                  -> [{"confidence": 100.0, "language": code}]: the one source language served
    GET /languages -> [{"code", "name", "targets"}]: every language of every model, each
                     with the languages it translates into (a multilingual model: its
                     directions)
    errors        -> {"error": message}, status 400 (403 for the API key, 413 over a limit)

`source` and `target` pick the model and, for a multilingual model, the target language's
tag (a language it does not know: a 400 naming the ones it knows). Each line of a text is
translated as one sentence and the lines are joined again, so
paragraphs keep their shape. "auto" takes the one source language that translates into the
target, and /detect answers the one source language the server translates from: this
server has no language detector, so with several source languages both are a 400 asking
for source=.

`glossary` is not LibreTranslate's (its clients never send it): a JSON object, or that
object as a JSON string (a form field); it goes over the model's own glossary, as in nmt's
API. A translation that misses a glossary term (it did not fit the length limit) is
logged as a warning.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from nmt.serving.errors import ApiError, bad_request, check_text, printable
from nmt.serving.models import AUTO
from nmt.serving.service import Service, json_chars, request_glossary, texts_of

log = logging.getLogger("nmt.serving")

ALTERNATIVES_LIMIT = 8  # LibreTranslate's alternatives: at most this many per text


def router(service: Service) -> APIRouter:
    routes = APIRouter()

    @routes.get("/languages")
    async def languages() -> JSONResponse:
        return JSONResponse(service.registry().languages())

    @routes.post("/detect")
    async def detect(request: Request) -> JSONResponse:
        params = await _params(request)
        service.check_key(_key(params, request), request.headers.get("authorization"))
        q = params.get("q")
        if not q:
            raise bad_request("Invalid request: missing q parameter")
        if not isinstance(q, str):
            raise bad_request("q: must be a string")
        source = service.registry().only_source()
        return JSONResponse([{"confidence": 100.0, "language": source}])

    @routes.post("/translate")
    async def translate(request: Request) -> JSONResponse:
        params = await _params(request)
        service.check_key(_key(params, request), request.headers.get("authorization"))
        q = params.get("q")
        source, target = params.get("source"), params.get("target")
        for name, value in (("q", q), ("source", source), ("target", target)):
            if not value:
                raise bad_request(f"Invalid request: missing {name} parameter")
        if not (isinstance(q, str) or (isinstance(q, list) and all(isinstance(t, str) for t in q))):
            raise bad_request("q: must be a string or a list of strings")
        if not isinstance(source, str) or not isinstance(target, str):
            name = "source" if not isinstance(source, str) else "target"
            raise bad_request(f"{name}: must be a language code (a string)")
        text_format = params.get("format")
        if text_format not in (None, "", "text"):
            raise bad_request(f"format={text_format}: not supported; use format=text")
        alternatives = _alternatives(params.get("alternatives"), service.cfg.max_beam)
        texts = [q] if isinstance(q, str) else q
        if not request_is_json(request):  # as LibreTranslate: form line ends become \n
            texts = ["\n".join(t.splitlines()) for t in texts]
        lines = [line for t in texts for line in t.split("\n")]
        glossary = _glossary(params.get("glossary"))
        service.check_size("q", lines, extra_chars=json_chars(glossary))
        route = service.find(None, source, target)
        model = route.model
        wanted = {"nbest": alternatives + 1}  # n alternatives need a beam of n + 1
        if alternatives + 1 > model.search.beam:
            wanted["beam"] = alternatives + 1
        search = service.search(model, wanted)
        answer = await service.translate(
            model,
            lines,
            texts_of,
            search=search,
            glossary=request_glossary(glossary),
            where="q",
            src_lang=route.src_lang,
            tgt_lang=route.tgt_lang,
        )
        for warning in answer.warnings:
            log.warning("%s", warning)
        outputs = answer.value
        best, others, at = [], [], 0
        for t in texts:
            n = t.count("\n") + 1
            per_line = outputs[at : at + n]
            at += n
            best.append("\n".join(hyps[0] for hyps in per_line))
            if alternatives:
                others.append(_alternative_texts(per_line, alternatives, best[-1]))
        out: dict[str, Any] = {"translatedText": best[0] if isinstance(q, str) else best}
        if source == AUTO:
            detected = {"confidence": 100.0, "language": route.source}
            out["detectedLanguage"] = detected if isinstance(q, str) else [detected] * len(q)
        if alternatives:
            out["alternatives"] = others[0] if isinstance(q, str) else others
        return JSONResponse(out)

    return routes


def request_is_json(request: Request) -> bool:
    """As Flask's request.is_json: application/json or application/*+json."""
    mime = request.headers.get("content-type", "").split(";")[0].strip().lower()
    return mime == "application/json" or (
        mime.startswith("application/") and mime.endswith("+json")
    )


async def _params(request: Request) -> dict[str, Any]:
    """The request's parameters: its JSON object, or its form fields over its query
    string; all of their text checked (errors.check_text)."""
    if request_is_json(request):
        try:
            body = json.loads(await request.body())
        except (ValueError, RecursionError) as exc:  # bad JSON or UTF-8; nested too deep
            raise bad_request(f"body: not valid JSON ({exc})") from None
        if not isinstance(body, dict):
            raise bad_request("body: Invalid JSON format; send a JSON object")
        check_text(body)
        return body
    params: dict[str, Any] = dict(request.query_params)
    if request.method == "POST":
        try:
            form = await request.form()
        except ApiError:
            raise
        except Exception as exc:  # noqa: BLE001 - python-multipart's many parse errors
            raise bad_request(f"body: not a readable form ({exc})") from None
        params.update({k: v for k, v in form.items() if isinstance(v, str)})
    check_text(params)
    return params


def _key(params: dict[str, Any], request: Request) -> str | None:
    """LibreTranslate's api_key (the npm client's spelling apiKey too), from the body or
    form, else from the query string (a JSON body's too)."""
    key = params.get("api_key") or params.get("apiKey") or request.query_params.get("api_key")
    return key if isinstance(key, str) and key else None


def _glossary(value: Any) -> Any:
    """nmt's `glossary` parameter as parsed JSON: a form sends the object as a JSON string
    (the text in it checked again: JSON escapes may spell what is not UTF-8)."""
    if not isinstance(value, str):
        return value
    if not value:
        return None
    try:
        parsed = json.loads(value)
    except (ValueError, RecursionError):
        raise bad_request(
            f"glossary={printable(value)[:40]}: not JSON; give an object "
            '{"source term": "target term", ...}'
        ) from None
    check_text({"glossary": parsed})
    return parsed


def _alternatives(value: Any, max_beam: int) -> int:
    """The alternatives asked for (a whole number, or its digits in a form): n more
    translations need a beam of n + 1."""
    if value is None or value == "":
        return 0
    most = min(ALTERNATIVES_LIMIT, max_beam - 1)
    if isinstance(value, str) and len(value) < 100:  # a form's digits
        try:
            value = int(value)
        except ValueError:
            pass
    if not isinstance(value, int) or isinstance(value, bool):
        shown = printable(value if isinstance(value, str) else json.dumps(value))[:40]
        raise bad_request(
            f"alternatives={shown}: not a number of alternatives; give a whole number "
            f"from 0 to {most}"
        )
    if not 0 <= value <= most:
        shown = str(value) if value.bit_length() < 64 else "a huge number"
        raise bad_request(f"alternatives={shown}: not between 0 and {most}; ask for fewer")
    return value


def _alternative_texts(per_line: list[list[str]], wanted: int, best: str) -> list[str]:
    """Up to `wanted` other translations of a text, each distinct (LibreTranslate's way:
    the k-th alternative of the text takes each line's k-th hypothesis, or its best)."""
    out: list[str] = []
    for k in range(1, max(len(h) for h in per_line)):
        text = "\n".join(h[k] if k < len(h) else h[0] for h in per_line)
        if text != best and text not in out:
            out.append(text)
    return out[:wanted]
