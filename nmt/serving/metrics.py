"""The server's Prometheus metrics (prometheus-client), in a registry of the app's own.

nmt_serve_requests_total{route,status}      requests answered
nmt_serve_request_seconds{route}            latency, histogram
nmt_serve_errors_total{route,kind}          refused or failed requests, by reason
nmt_serve_in_flight                         requests being handled now
nmt_serve_sentences_total{model}            sentences decoded
nmt_serve_dropped_sentences_total{model}    sentences given up (client gone, deadline passed,
                                            server stopping): not decoded, or stopped mid-batch
nmt_serve_batch_sentences{model}            sentences per decoding batch, histogram
nmt_serve_batch_seconds{model}              time per decoding batch, histogram
nmt_serve_queue_sentences{model}            sentences waiting (read at scrape time)
nmt_serve_models_loaded                     1 once every model is loaded
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
CONTENT_TYPE = CONTENT_TYPE_LATEST


class _QueueDepth(Collector):
    """Per-model queue depth, read from the queues when scraped (no cost per request)."""

    def __init__(self, depths: Callable[[], dict[str, int]]):
        self.depths = depths

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "nmt_serve_queue_sentences", "Sentences waiting to be decoded", labels=["model"]
        )
        for model, depth in self.depths().items():
            family.add_metric([model], depth)
        yield family


class Metrics:
    """The metrics of one app; `depths()` gives each model's queued sentences."""

    def __init__(self, depths: Callable[[], dict[str, int]]):
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "nmt_serve_requests", "HTTP requests answered", ["route", "status"], registry=r
        )
        self.latency = Histogram(
            "nmt_serve_request_seconds",
            "Time from request to answer",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.errors = Counter(
            "nmt_serve_errors",
            "Requests refused or failed, by reason",
            ["route", "kind"],
            registry=r,
        )
        self.in_flight = Gauge("nmt_serve_in_flight", "Requests being handled", registry=r)
        self.sentences = Counter("nmt_serve_sentences", "Sentences decoded", ["model"], registry=r)
        self.dropped_sentences = Counter(
            "nmt_serve_dropped_sentences",
            "Sentences whose request was given up: not decoded, or stopped mid-batch",
            ["model"],
            registry=r,
        )
        self.batch_sentences = Histogram(
            "nmt_serve_batch_sentences",
            "Sentences per decoding batch",
            ["model"],
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.batch_seconds = Histogram(
            "nmt_serve_batch_seconds",
            "Decoding time per batch",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.models_loaded = Gauge(
            "nmt_serve_models_loaded", "1 once every model is loaded", registry=r
        )
        r.register(_QueueDepth(depths))

    def batch(self, model: str, sentences: int, seconds: float) -> None:
        """A decoding batch finished (called from the model's worker thread)."""
        self.sentences.labels(model).inc(sentences)
        self.batch_sentences.labels(model).observe(sentences)
        self.batch_seconds.labels(model).observe(seconds)

    def dropped(self, model: str, sentences: int) -> None:
        """Sentences given up (called from the model's worker thread)."""
        self.dropped_sentences.labels(model).inc(sentences)

    def answered(self, route: str, status: int, seconds: float, kind: str | None) -> None:
        self.requests.labels(route, str(status)).inc()
        self.latency.labels(route).observe(seconds)
        if kind is not None:
            self.errors.labels(route, kind).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
