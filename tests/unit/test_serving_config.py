"""ServeConfig and ModelSpec: configs/serve.yaml is the dataclass's defaults, every check
speaks in the `option=value: what is wrong; what to do` style, a model's search is the
server's with its own options over it."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from nmt.errors import NmtError
from nmt.generation.config import SearchConfig
from nmt.serving.config import ModelSpec, ServeConfig

REPO = Path(__file__).resolve().parents[2]


def test_the_yaml_is_the_dataclass():
    yaml = OmegaConf.to_container(OmegaConf.load(REPO / "configs" / "serve.yaml"))
    assert yaml.pop("defaults") == ["serve_schema", "_self_"]
    assert yaml == dataclasses.asdict(ServeConfig())
    merged = OmegaConf.merge(OmegaConf.structured(ServeConfig), yaml)  # keys and types fit
    assert OmegaConf.to_object(merged) == ServeConfig()


def test_models_from_yaml_are_model_specs():
    merged = OmegaConf.merge(
        OmegaConf.structured(ServeConfig),
        OmegaConf.create(
            "models: [{name: en-de, checkpoint: a.pt}, {checkpoint: [b.pt, c.pt], search: {beam: 2}}]"
        ),
    )
    cfg = OmegaConf.to_object(merged)
    assert cfg.models == [
        ModelSpec(checkpoint="a.pt", name="en-de"),
        ModelSpec(checkpoint=["b.pt", "c.pt"], search={"beam": 2}),
    ]
    cfg.validate()
    assert cfg.search_for(cfg.models[1]) == dataclasses.replace(SearchConfig(), beam=2)


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(port=70000), "port=70000: not a TCP port; use 1..65535, or 0 for any free port"),
        (dict(host=""), "host='': empty; use 127.0.0.1"),
        (dict(api_key=" "), "api_key=' ': empty; give a key, or null for no key"),
        (dict(max_wait_ms=-1.0), "max_wait_ms=-1.0: must not be negative"),
        (dict(request_timeout=0.0), "request_timeout=0.0: no request could finish"),
        (dict(max_queue=0), "max_queue=0: must be 1 or more"),
        (dict(max_request_chars=0), "max_request_chars=0: must be 1 or more"),
        (dict(max_sentences=0), "max_sentences=0: must be 1 or more"),
        (dict(overlong="skip"), "overlong=skip: unknown; use one of truncate, error"),
        (dict(precision="fp8"), "precision=fp8: unknown; use one of fp32, bf16, fp16, auto, int8"),
        (dict(log_level="loud"), "log_level=loud: unknown; use one of critical"),
        (dict(api_docs="yes"), "api_docs=yes: unknown; use one of off, key, public"),
        (dict(api_docs="False"), "api_docs=False: YAML reads off as false; write api_docs"),
        (dict(unkpen=1e308), "unkpen=1e+308: out of range (-50 to 50)"),
        (dict(max_len_a=float("nan")), "max_len_a=nan: not a finite number"),
        (dict(threads=-1), "threads=-1: must not be negative"),
        (dict(beam=0), "beam=0: must be 1 or more; use 1 for greedy search"),
        (dict(max_beam=0), "max_beam=0: must be 1 or more"),
        (
            dict(beam=20),
            "beam=20: more than this server's max_beam=16; use a narrower beam, or raise",
        ),
        (
            dict(models=[ModelSpec("a.pt", search={"beam": 8})], max_beam=4),
            "models[0].search.beam=8: more than this server's max_beam=4",
        ),
        (
            dict(checkpoint="a.pt", models=[ModelSpec(checkpoint="b.pt")]),
            "checkpoint=a.pt: given together with models=",
        ),
        (dict(models=[ModelSpec()]), "models[0].checkpoint=null: no checkpoint given"),
        (
            dict(models=[ModelSpec("a.pt", "x"), ModelSpec("b.pt", "x")]),
            "models[1].name=x: also the name of models[0]; give each model its own name",
        ),
        (dict(models=[ModelSpec("a.pt", "en/de")]), "models[0].name='en/de': not a usable name"),
        (
            dict(models=[ModelSpec("a.pt", search={"bem": 2})]),
            "models[0].search.bem=2: not a search option; did you mean beam?",
        ),
        (
            dict(models=[ModelSpec("a.pt", search={"beam": 2, "nbest": 3})]),
            "models[0].search.nbest=3: must be between 1 and beam=2",
        ),
        (
            dict(models=[ModelSpec("a.pt", search={"beam": "wide"})]),
            "models[0].search.beam='wide': not a whole number; e.g. beam=5",
        ),
    ],
)
def test_checks(options, message):
    with pytest.raises(NmtError) as exc:
        ServeConfig(**options).validate()
    assert str(exc.value).startswith(message) and "\n" not in str(exc.value)


def test_a_missing_checkpoint_is_checked_when_serving():
    ServeConfig().validate()  # --cfg works without one
    with pytest.raises(NmtError, match=r"^checkpoint=null: no checkpoint given; give checkpoint="):
        ServeConfig().model_specs()
    assert ServeConfig(checkpoint="x.pt").model_specs() == [ModelSpec(checkpoint="x.pt")]


def test_importing_the_config_is_cheap():
    code = (
        "import sys, nmt.serving, nmt.serving.config; "
        "assert not {'torch', 'fastapi', 'uvicorn'} & set(sys.modules), sys.modules.keys()"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(allowed_hosts=[]), 'allowed_hosts=[]: no request could be served; use ["*"]'),
        (
            dict(allowed_hosts=["http://example.org"]),
            "allowed_hosts=[http://example.org]: 'http://example.org' is not a host name; "
            "give names without scheme or port",
        ),
        (
            dict(allowed_hosts=["example.org:80"]),
            "allowed_hosts=[example.org:80]: 'example.org:80'",
        ),
        (
            dict(allowed_hosts=["ex*.org"]),
            "allowed_hosts=[ex*.org]: 'ex*.org' is not a host name",
        ),
        (dict(allowed_hosts=["*."]), "allowed_hosts=[*.]: '*.' is not a host name"),
        (dict(allowed_hosts=[" a.org"]), "allowed_hosts=[ a.org]: ' a.org' is not a host name"),
        (dict(max_url_bytes=10), "max_url_bytes=10: under 64 refuses ordinary clients; raise it"),
        (dict(max_header_bytes=100), "max_header_bytes=100: under 1024 refuses ordinary clients"),
        (dict(max_headers=0), "max_headers=0: under 8 refuses ordinary clients"),
        (dict(max_connections=0), "max_connections=0: under 1 refuses ordinary clients"),
        (dict(header_timeout=0.0), "header_timeout=0.0: not a usable number of seconds; e.g. 10"),
        (dict(header_timeout=float("nan")), "header_timeout=nan: not a usable number of seconds"),
        (dict(body_timeout=-1.0), "body_timeout=-1.0: not a usable number of seconds; e.g. 30"),
        (dict(body_timeout=float("inf")), "body_timeout=inf: not a usable number of seconds"),
        (dict(keep_alive_timeout=-1.0), "keep_alive_timeout=-1.0: not a usable number of seconds"),
    ],
)
def test_http_limit_checks(options, message):
    with pytest.raises(NmtError) as exc:
        ServeConfig(**options).validate()
    assert str(exc.value).startswith(message) and "\n" not in str(exc.value)


def test_usable_http_limits():
    ServeConfig(
        allowed_hosts=["translate.example.org", "*.example.org", "127.0.0.1", "::1", "[::1]"],
        keep_alive_timeout=0.0,  # no keep-alive
        max_url_bytes=64,
        max_header_bytes=1024,
        max_headers=8,
        max_connections=1,
    ).validate()
