"""nmt-serve under overload, abandoned requests and a drain past its timeout, as a real
process: the work of clients that left is dropped (a short request after ten abandoned
heavy ones is answered about as fast as on an idle server), a request that cannot finish
before its deadline is refused at once (503 with Retry-After) instead of slowing everyone
into a timeout, and SIGTERM past shutdown_timeout, or a second signal, answers the
requests in flight with a JSON 503 and exits 0.

The heavy request's size is derived from this machine's speed (HeavyLoad), so each one
takes about a second anywhere."""

from __future__ import annotations

import json
import math
import re
import signal
import socket
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.integration.serve_process import ServeProcess, train_checkpoint

BATCH = 8  # max_sentences of the servers here: a heavy request fills whole batches
LENGTH = 300  # tokens each heavy sentence is forced to (min_len = max_len)
HEAVY_SECONDS = 1.0  # what a heavy request is made to take, at least
ALLOWANCE = 1.0  # seconds over 2x the idle latency (a shared CI machine's jitter)


@dataclass
class HeavyLoad:
    """A /v1/translate body of `batches` full batches of long, wide-beam outputs, and
    the seconds one such request took alone."""

    line: str
    batches: int
    seconds: float

    def body(self) -> dict:
        return {
            "texts": [self.line] * (BATCH * self.batches),
            "beam": 16,
            "min_len": LENGTH,
            "max_len_b": LENGTH,
            "max_len_a": 0,
        }

    @property
    def sentences(self) -> int:
        return BATCH * self.batches


@pytest.fixture(scope="module")
def checkpoint(demo_data_dir, tmp_path_factory) -> Path:
    return train_checkpoint(demo_data_dir, tmp_path_factory.mktemp("serve-overload-run"))


@pytest.fixture(scope="module")
def line(demo_corpus) -> str:
    return (demo_corpus / "test.en").read_text(encoding="utf-8").splitlines()[3]


@pytest.fixture(scope="module")
def server(checkpoint):
    process = ServeProcess(checkpoint, f"max_sentences={BATCH}")
    yield process
    assert process.stop() == 0, process.output()


@pytest.fixture(scope="module")
def heavy(server, line) -> HeavyLoad:
    """One batch timed alone, then as many batches per request as make HEAVY_SECONDS."""
    one = HeavyLoad(line, 1, 0.0)
    start = time.monotonic()
    answer = httpx.post(f"{server.url}/v1/translate", json=one.body(), timeout=300)
    assert answer.status_code == 200, answer.text
    batch_seconds = time.monotonic() - start
    batches = min(16, math.ceil(HEAVY_SECONDS / batch_seconds))  # 128 sentences at most
    return HeavyLoad(line, batches, batches * batch_seconds)


def _metric(url: str, name: str) -> float:
    found = re.search(rf"^{name}(?:{{[^}}]*}})? (\S+)$", httpx.get(f"{url}/metrics").text, re.M)
    return float(found.group(1)) if found else 0.0


def _wait_in_flight(url: str, requests: int, timeout: float = 60) -> None:
    """Until `requests` requests are in flight (and the /metrics request asking)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _metric(url, "nmt_serve_in_flight") >= requests + 1:
            return
        time.sleep(0.01)
    raise AssertionError(f"{requests} requests were not in flight together")


def _send_raw(url: str, body: dict) -> socket.socket:
    """A POST /v1/translate written on a socket of its own (to close unanswered)."""
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port))
    payload = json.dumps(body).encode()
    head = (
        f"POST /v1/translate HTTP/1.1\r\nHost: {parts.netloc}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    )
    sock.sendall(head.encode() + payload)
    return sock


def _short_latency(client: httpx.Client, line: str) -> float:
    start = time.monotonic()
    answer = client.post("/v1/translate", json={"texts": [line]})
    assert answer.status_code == 200, answer.text
    return time.monotonic() - start


def test_abandoned_requests_are_dropped(server, heavy, line):
    """Ten heavy requests sent and abandoned: their work stops (at the next decoding
    step for the batch running), so a one-sentence request then is answered within 2x
    its idle latency (+ ALLOWANCE), where it would wait for all of them (10 s or more)."""
    url = server.url
    with httpx.Client(base_url=url, timeout=120) as client:
        idle = statistics.median(_short_latency(client, line) for _ in range(5))
        dropped_before = _metric(url, "nmt_serve_dropped_sentences_total")
        sockets = [_send_raw(url, heavy.body()) for _ in range(10)]
        _wait_in_flight(url, 10)
        for sock in sockets:
            sock.close()
        after = _short_latency(client, line)
    assert after <= 2 * idle + ALLOWANCE, (after, idle, heavy)
    dropped = _metric(url, "nmt_serve_dropped_sentences_total") - dropped_before
    # all but what was decoded before the sockets closed (a batch or two at most)
    assert dropped >= 10 * heavy.sentences - 2 * BATCH, (dropped, heavy)
    assert _metric(url, "nmt_serve_queue_sentences") == 0


def test_overload_is_refused_at_once_not_timed_out(checkpoint, heavy):
    """Eight heavy requests at once, with a request_timeout that fits about two: the
    others are refused at once (503, Retry-After, naming request_timeout) instead of
    every request advancing together until all time out."""
    timeout = round(2.5 * heavy.seconds, 2)
    process = ServeProcess(checkpoint, f"max_sentences={BATCH}", f"request_timeout={timeout}")
    try:
        warm = httpx.post(f"{process.url}/v1/translate", json=heavy.body(), timeout=120)
        assert warm.status_code == 200  # (and the server has measured its speed)
        answers: list[tuple[httpx.Response, float]] = []

        def one() -> None:
            start = time.monotonic()
            answer = httpx.post(f"{process.url}/v1/translate", json=heavy.body(), timeout=120)
            answers.append((answer, time.monotonic() - start))

        threads = [threading.Thread(target=one) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        assert process.stop() == 0, process.output()
    described = [(a.status_code, a.text[:160], round(s, 2)) for a, s in answers]
    assert len(answers) == 8, described
    ok = [seconds for answer, seconds in answers if answer.status_code == 200]
    refused = [(a, s) for a, s in answers if a.status_code == 503 and "retry in" in a.text]
    timed_out = [a for a, _ in answers if a.status_code == 503 and "not translated in" in a.text]
    assert len(ok) + len(refused) + len(timed_out) == 8, described
    assert ok and all(seconds <= timeout for seconds in ok), described
    # about two fit; when the measured speed is off, one more may be admitted, and time
    # out with the one it shares its batches with
    assert len(refused) >= 8 - 4 and len(timed_out) <= 2, described
    # Refused on arrival: before the first admitted request is answered, which took its
    # decoding. (Both in this run: a loaded machine slows them alike, where a bound from
    # the warm-up's speed once failed under load.)
    for answer, seconds in refused:
        assert seconds < min(ok), described
        assert f"request_timeout={timeout:g}: " in answer.json()["error"]
        assert int(answer.headers["Retry-After"]) >= 1


def _in_flight_heavy(process: ServeProcess, heavy: HeavyLoad, requests: int):
    """`requests` heavy requests in flight on `process`: (threads, answers)."""
    answers: list[httpx.Response] = []

    def one() -> None:
        answers.append(httpx.post(f"{process.url}/v1/translate", json=heavy.body(), timeout=120))

    threads = [threading.Thread(target=one) for _ in range(requests)]
    for t in threads:
        t.start()
    _wait_in_flight(process.url, requests)
    return threads, answers


def _stopping_answers(answers: list[httpx.Response]) -> list[httpx.Response]:
    """The JSON 503s of a stopping server; every other answer must be a 200."""
    stopping = []
    for answer in answers:
        if answer.status_code == 200:
            continue
        assert answer.status_code == 503, answer.text
        assert answer.headers["content-type"] == "application/json", answer.text
        assert answer.json()["error"].startswith("the server is stopping; "), answer.text
        stopping.append(answer)
    return stopping


def _clean_exit(process: ServeProcess) -> None:
    output = process.output()
    assert "Traceback" not in output and "Aborted" not in output, output
    assert output.rstrip().endswith("nmt-serve: stopped"), output


def test_a_drain_past_shutdown_timeout_answers_503_and_exits_0(checkpoint, heavy):
    """Four heavy requests (about 4 s of work) in flight, shutdown_timeout=1: after
    SIGTERM the server finishes what it can in 1 s, answers the rest with a JSON 503,
    stops its worker and exits 0 (it used to abort: exit 134)."""
    process = ServeProcess(checkpoint, f"max_sentences={BATCH}", "shutdown_timeout=1")
    threads, answers = _in_flight_heavy(process, heavy, 4)
    start = time.monotonic()
    process.terminate()
    code = process.proc.wait(60)
    took = time.monotonic() - start
    for t in threads:
        t.join(60)
    assert code == 0, process.output()
    assert len(answers) == 4 and _stopping_answers(answers), [a.text for a in answers]
    assert took < 1 + 10, took  # the drain, then one decoding step and the worker's exit
    _clean_exit(process)


@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT])
def test_a_second_signal_cuts_the_drain_short(checkpoint, heavy, second):
    """Ten heavy requests (about 10 s of work) in flight and shutdown_timeout=60:
    SIGTERM starts the drain, a second SIGTERM or Ctrl-C answers the rest with a JSON 503
    at once, and the process exits 0 in a few seconds."""
    process = ServeProcess(checkpoint, f"max_sentences={BATCH}", "shutdown_timeout=60")
    threads, answers = _in_flight_heavy(process, heavy, 10)
    process.terminate()
    time.sleep(0.3)
    assert process.proc.poll() is None, process.output()
    start = time.monotonic()
    process.proc.send_signal(second)
    code = process.proc.wait(60)
    took = time.monotonic() - start
    for t in threads:
        t.join(60)
    assert code == 0, process.output()
    assert len(answers) == 10 and len(_stopping_answers(answers)) >= 8, [a.text for a in answers]
    assert took < 5, took
    _clean_exit(process)
