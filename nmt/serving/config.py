"""Configuration of nmt-serve: the models to serve (ModelSpec) and the server (ServeConfig).

ServeConfig extends SearchConfig, so `nmt-serve checkpoint=ckpt.pt beam=4` sets the search
every model uses unless its own `search:` says otherwise, and requests may override it per
call. Every check raises NmtError in one style: `option=value: what is wrong; what to do`.
Importing this module imports neither torch nor FastAPI (the CLI reads it for --help).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any, Optional

from nmt.errors import NmtError, choice_error, option_error
from nmt.generation.config import PRECISIONS, SearchConfig, check_batching

LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
API_DOCS = ("off", "key", "public")


def _host_pattern(host: Any) -> bool:
    """A usable allowed_hosts entry: "*", a name, *.domain, or an IP address (no port)."""
    if not isinstance(host, str) or not host or host != host.strip():
        return False
    if ":" in host:  # only an IPv6 address has one
        try:
            ipaddress.IPv6Address(host.strip("[]"))
        except ValueError:
            return False
        return True
    name = host[2:] if host.startswith("*.") else host
    return host == "*" or (bool(name) and not any(c in name for c in "*/ "))


@dataclass
class ModelSpec:
    """One model the server loads, under a name that requests use."""

    checkpoint: Any = None  # checkpoint file, or a list [a.pt,b.pt] to ensemble (required)
    name: Optional[str] = None  # the name requests give as `model`; null: "<src>-<tgt>" (en-de)
    search: dict[str, Any] = field(default_factory=dict)  # search options over the server's
    glossary: Optional[str] = None  # TSV `source term<TAB>target term` lines; null: none


@dataclass
class ServeConfig(SearchConfig):
    """nmt-serve: translation over HTTP (LibreTranslate-compatible and native routes)."""

    # what to serve
    checkpoint: Any = None  # one model: a checkpoint file or [a.pt,b.pt]; or use models=
    models: list[ModelSpec] = field(default_factory=list)  # several models by name
    glossary: Optional[str] = None  # the glossary of checkpoint= (TSV); models=: each its own
    # where
    host: str = "127.0.0.1"  # the address to bind; 0.0.0.0 opens the server to the network
    port: int = 5000  # TCP port; 0 = any free port (the port is printed)
    # access
    api_key: Optional[str] = None  # when set, every translation request must carry this key
    cors_origins: list[str] = field(default_factory=lambda: ["*"])  # browser origins allowed
    web_page: bool = True  # serve the translation page at /
    api_docs: str = "key"  # /docs and /openapi.json: off, key (need api_key, if set) or public
    allowed_hosts: list[str] = field(default_factory=lambda: ["*"])  # Host header names served
    # (exact, or *.example.com; ["*"] = any); on a network, name the server's own
    # HTTP limits, enforced before a request reaches the app (see nmt/serving/protocol.py)
    max_url_bytes: int = 8192  # request URL (longer: 414); nginx's and Apache's 8 KB line
    max_header_bytes: int = 16384  # all header lines together (more: 431); h11's 16 KiB head
    max_headers: int = 100  # header lines (more: 431); Apache's and Python's http.client's 100
    header_timeout: float = 10.0  # seconds from a connection's (or request's) start to its
    # headers' end, however the bytes trickle in (then 408)
    body_timeout: float = 30.0  # seconds from the headers' end to the body's end (then 408)
    keep_alive_timeout: float = 5.0  # seconds an idle keep-alive connection stays open (uvicorn's)
    max_connections: int = 1000  # connections open at once; beyond: 503 at once
    # batching across requests
    max_tokens: int = 0  # padded source tokens per decoding batch (0 = no limit)
    max_sentences: int = 64  # sentences per decoding batch
    max_wait_ms: float = 100.0  # longest a free worker waits for more sentences to batch
    wait_gap_ms: float = 10.0  # ... and it stops waiting after a pause this long
    max_queue: int = 4096  # sentences waiting per model; beyond, requests get 503
    # limits per request
    max_request_chars: int = 10000  # characters of text (and prefixes, constraints,
    # glossary terms) in one request
    max_request_sentences: int = 128  # sentences (texts, or lines of texts) in one request
    max_body_bytes: int = 1_000_000  # request body size
    max_beam: int = 16  # widest beam (samples per sentence) a request may ask for
    request_timeout: float = 60.0  # seconds a request may wait for its translations
    shutdown_timeout: float = 30.0  # seconds SIGTERM waits for in-flight requests
    overlong: str = "truncate"  # source longer than the model accepts: truncate or error
    alignment_layer: int = -1  # decoder layer whose attention the alignments and heatmaps show
    # hardware
    device: str = "auto"  # cpu, cuda, cuda:N, or auto
    precision: str = "fp32"  # fp32, bf16, fp16 (cuda), auto (bf16 if native) or int8 (cpu)
    threads: int = 0  # torch CPU threads (0 = torch's default)
    # logs
    log_level: str = "info"  # critical, error, warning, info, debug
    access_log: bool = True  # one log line per request
    debug: bool = False  # full tracebacks instead of one-line errors

    def validate(self) -> None:
        """Raise NmtError naming the first option that cannot work."""
        super().validate()
        if self.max_beam < 1:
            raise option_error("max_beam", self.max_beam, "must be 1 or more", "e.g. 16")
        # checkpoint= / models= and every model's search (a missing checkpoint is reported
        # when serving, so that --cfg works without one)
        self.model_specs(require_checkpoint=False)
        if not 0 <= self.port <= 65535:
            raise option_error(
                "port", self.port, "not a TCP port", "use 1..65535, or 0 for any free port"
            )
        if not self.host:
            raise option_error("host", self.host, "empty", "use 127.0.0.1 (this machine only)")
        if self.api_key is not None and not self.api_key.strip():
            raise option_error(
                "api_key", repr(self.api_key), "empty", "give a key, or null for no key"
            )
        self._check_http()
        check_batching(self.max_tokens, self.max_sentences, self.overlong)
        for key, fix in (
            ("max_wait_ms", "use 0 to decode as soon as the worker is free"),
            ("wait_gap_ms", "use 0 to decode as soon as the worker is free"),
            ("request_timeout", "e.g. 60 seconds"),
            ("shutdown_timeout", "e.g. 30 seconds"),
        ):
            if not getattr(self, key) >= 0:
                raise option_error(key, getattr(self, key), "must not be negative", fix)
        if self.request_timeout == 0:
            raise option_error(
                "request_timeout",
                self.request_timeout,
                "no request could finish",
                "e.g. 60 seconds",
            )
        for key in ("max_queue", "max_request_chars", "max_request_sentences", "max_body_bytes"):
            if getattr(self, key) < 1:
                raise option_error(key, getattr(self, key), "must be 1 or more", "raise it")
        if self.precision not in PRECISIONS:
            raise choice_error("precision", self.precision, PRECISIONS)
        if self.threads < 0:
            raise option_error(
                "threads", self.threads, "must not be negative", "use 0 for torch's default"
            )
        if self.api_docs in ("False", "false"):  # YAML reads an unquoted off as false
            raise option_error(
                "api_docs", self.api_docs, "YAML reads off as false", 'write api_docs: "off"'
            )
        if self.api_docs not in API_DOCS:
            raise choice_error("api_docs", self.api_docs, API_DOCS)
        if self.log_level not in LOG_LEVELS:
            raise choice_error("log_level", self.log_level, LOG_LEVELS)

    def _check_http(self) -> None:
        """allowed_hosts and the HTTP limits."""
        hosts = list(self.allowed_hosts)
        if not hosts:
            raise option_error(
                "allowed_hosts", "[]", "no request could be served", 'use ["*"] for any host'
            )
        for host in hosts:
            if not _host_pattern(host):
                raise option_error(
                    "allowed_hosts",
                    hosts,
                    f"{host!r} is not a host name",
                    'give names without scheme or port: example.org, *.example.org, ::1, or "*"',
                )
        for key, least in (
            ("max_url_bytes", 64),
            ("max_header_bytes", 1024),
            ("max_headers", 8),
            ("max_connections", 1),
        ):
            if getattr(self, key) < least:
                raise option_error(
                    key, getattr(self, key), f"under {least} refuses ordinary clients", "raise it"
                )
        for key, fix in (
            ("header_timeout", "e.g. 10 seconds"),
            ("body_timeout", "e.g. 30 seconds"),
            ("keep_alive_timeout", "e.g. 5 seconds, or 0 to close after each answer"),
        ):
            value = getattr(self, key)
            usable = value > 0 or (key == "keep_alive_timeout" and value == 0)
            if not usable or value == float("inf"):
                raise option_error(key, value, "not a usable number of seconds", fix)

    def model_specs(self, require_checkpoint: bool = True) -> list[ModelSpec]:
        """The models to load: `checkpoint=` as one unnamed model, or `models=`; checked."""
        if self.checkpoint is not None and self.models:
            raise option_error(
                "checkpoint",
                self.checkpoint,
                "given together with models=",
                "list every model under models= (each with its checkpoint), or give one checkpoint=",
            )
        if self.glossary is not None and self.models:
            raise option_error(
                "glossary",
                self.glossary,
                "given together with models=",
                "give each model its own glossary: under models=",
            )
        specs = list(self.models) or [ModelSpec(checkpoint=self.checkpoint, glossary=self.glossary)]
        names: dict[str, int] = {}
        for i, spec in enumerate(specs):
            where = "checkpoint" if not self.models else f"models[{i}].checkpoint"
            missing = spec.checkpoint is None or spec.checkpoint == "" or spec.checkpoint == []
            if missing and (require_checkpoint or self.models):
                raise option_error(
                    where,
                    spec.checkpoint,
                    "no checkpoint given",
                    "give checkpoint=FILE (or models=[{name: en-de, checkpoint: FILE}, ...])",
                )
            if spec.name is not None:
                if not spec.name or "/" in spec.name or spec.name != spec.name.strip():
                    raise option_error(
                        f"models[{i}].name",
                        repr(spec.name),
                        "not a usable name",
                        "use letters, digits, - and _ (e.g. en-de)",
                    )
                if spec.name in names:
                    raise option_error(
                        f"models[{i}].name",
                        spec.name,
                        f"also the name of models[{names[spec.name]}]",
                        "give each model its own name",
                    )
                names[spec.name] = i
            if spec.glossary is not None and not str(spec.glossary).strip():
                where = "glossary" if not self.models else f"models[{i}].glossary"
                raise option_error(
                    where, repr(spec.glossary), "empty", "give a TSV file, or null for none"
                )
            self.search_for(spec, f"models[{i}].search")
        return specs

    def search_for(self, spec: ModelSpec, where: str = "search") -> SearchConfig:
        """The server's search with the model's own options over it, checked
        (SearchConfig.with_options, as every search is made)."""
        try:
            search = self.with_options(spec.search)
            self.check_beam(search.beam, fix="use a narrower beam, or raise max_beam")
        except NmtError as exc:
            raise NmtError(f"{where}.{exc}" if spec.search else str(exc)) from None
        return search

    def check_beam(self, beam: int, fix: str = "use a narrower beam") -> None:
        """A beam within max_beam: a request's work (and memory) grows with it."""
        if beam > self.max_beam:
            raise option_error(
                "beam", beam, f"more than this server's max_beam={self.max_beam}", fix
            )
