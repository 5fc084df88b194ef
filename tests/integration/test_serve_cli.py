"""nmt-serve as a real uvicorn process on a free loopback port: concurrent clients get what
sequential requests and nmt-generate get, an unmodified LibreTranslate client works, bad
input is refused without stalling anyone, SIGTERM drains the requests in flight and exits 0,
and start-up mistakes are one-line errors."""

from __future__ import annotations

import random
import re
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.integration.serve_process import (
    ServeProcess,
    nmt_generate,
    train_checkpoint,
)

PAIR = {"source": "en", "target": "de"}


@pytest.fixture(scope="module")
def checkpoint(demo_data_dir, tmp_path_factory) -> Path:
    return train_checkpoint(demo_data_dir, tmp_path_factory.mktemp("serve-cli-run"))


@pytest.fixture(scope="module")
def server(checkpoint):
    process = ServeProcess(checkpoint, "max_request_sentences=16", "max_request_chars=2000")
    yield process
    assert process.stop() == 0, process.output()


@pytest.fixture(scope="module")
def lines(demo_corpus) -> list[str]:
    return (demo_corpus / "test.en").read_text(encoding="utf-8").splitlines()[:48]


@pytest.fixture(scope="module")
def offline(checkpoint, lines, tmp_path_factory) -> list[str]:
    """nmt-generate's translations of `lines`, as the console command writes them."""
    return nmt_generate(checkpoint, lines, tmp_path_factory.mktemp("serve-offline"))


def _batches(url: str) -> tuple[float, float]:
    """(sentences, batches) decoded so far, from /metrics."""
    text = httpx.get(f"{url}/metrics").text
    found = dict(re.findall(r"^nmt_serve_batch_sentences_(sum|count)\{[^}]*\} (\S+)$", text, re.M))
    return float(found.get("sum", 0)), float(found.get("count", 0))


def test_binds_the_loopback_address_by_default(server):
    assert server.url.startswith("http://127.0.0.1:")
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok", "models": ["en-de"]}


def test_concurrent_clients_equal_sequential_requests_and_nmt_generate(server, lines, offline):
    """Batching across clients never changes a translation: 16 clients at once (one
    sentence or three per request, in shuffled order) get exactly what one-by-one
    requests get, and what nmt-generate writes for the file."""
    url = server.url
    with httpx.Client(base_url=url, timeout=120) as client:
        sequential = [
            client.post("/translate", json={"q": line, **PAIR}).json()["translatedText"]
            for line in lines
        ]
    assert sequential == offline

    before = _batches(url)
    requests = [[i] for i in range(0, 24)] + [[i, i + 1, i + 2] for i in range(24, 48, 3)]
    random.Random(0).shuffle(requests)
    got: dict[int, str] = {}

    def client_work(mine: list[list[int]]) -> None:
        with httpx.Client(base_url=url, timeout=120) as client:
            for indices in mine:
                q = [lines[i] for i in indices]
                answer = client.post("/translate", json={"q": q, **PAIR})
                assert answer.status_code == 200, answer.text
                got.update(zip(indices, answer.json()["translatedText"]))

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(client_work, [requests[k::16] for k in range(16)]))
    assert [got[i] for i in range(len(lines))] == offline
    sentences, batches = (a - b for a, b in zip(_batches(url), before))
    assert sentences == len(lines) and batches < len(requests)  # requests shared batches


def test_an_unmodified_libretranslate_client(server, lines, offline):
    libretranslatepy = pytest.importorskip(
        "libretranslatepy", reason="the LibreTranslate client (test extra) is not installed"
    )
    client = libretranslatepy.LibreTranslateAPI(server.url)  # form-encoded, GET with a body
    assert client.languages() == [
        {"code": "en", "name": "English", "targets": ["de"]},
        {"code": "de", "name": "German", "targets": []},
    ]
    assert client.translate(lines[0], "en", "de") == offline[0]
    assert client.translate(lines[1], source="auto", target="de") == offline[1]
    assert client.detect(lines[2]) == [{"confidence": 100.0, "language": "en"}]


def test_the_api_key_with_a_libretranslate_client(checkpoint, lines, offline):
    libretranslatepy = pytest.importorskip(
        "libretranslatepy", reason="the LibreTranslate client (test extra) is not installed"
    )
    from urllib.error import HTTPError

    server = ServeProcess(checkpoint, "api_key=k3y")
    try:
        keyed = libretranslatepy.LibreTranslateAPI(server.url, api_key="k3y")
        assert keyed.translate(lines[2], "en", "de") == offline[2]
        with pytest.raises(HTTPError) as refused:
            libretranslatepy.LibreTranslateAPI(server.url).translate(lines[2], "en", "de")
        assert refused.value.code == 403
        bearer = {"Authorization": "Bearer k3y"}
        answer = httpx.post(f"{server.url}/v1/translate", json={"texts": ["one"]}, headers=bearer)
        assert answer.status_code == 200
    finally:
        assert server.stop() == 0


def test_bad_input_is_refused_and_stalls_nobody(server, lines, offline):
    url = server.url
    # a client that sends half a body and goes quiet holds only its own connection
    host, port = url.split("//")[1].split(":")
    stuck = socket.create_connection((host, int(port)))
    stuck.sendall(
        b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100\r\n\r\n" + b'{"q": "'
    )
    try:
        with httpx.Client(base_url=url, timeout=60) as client:
            for body, status in (
                (b'{"q": ', 400),  # malformed JSON
                (b'{"q": 5, "source": "en", "target": "de"}', 400),  # a wrong type
                (b'{"q": "one", "source": "fr", "target": "de"}', 400),  # a pair not served
                (b'{"q": "' + b"x" * 2001 + b'", "source": "en", "target": "de"}', 413),
            ):
                answer = client.post(
                    "/translate", content=body, headers={"Content-Type": "application/json"}
                )
                assert answer.status_code == status and "error" in answer.json(), answer.text
            assert client.post("/v1/translate", json={"texts": [1]}).status_code == 422
            for body, needle in (  # values no search can take: one line each, no 500
                ({"texts": ["one"], "beam": 10**6}, "beam=1000000: more than"),
                ({"texts": ["one"], "sampling": True, "seed": 10**30}, "out of range"),
                ({"texts": ["one"], "max_len_a": 1e308, "lenpen": 1e308}, "lenpen="),
            ):
                refused = client.post("/v1/translate", json=body)
                assert refused.status_code == 400 and needle in refused.json()["error"]
            deep = client.post(
                "/translate",
                content=b"[" * 100_000 + b"]" * 100_000,
                headers={"Content-Type": "application/json"},
            )
            assert deep.status_code == 400 and "not valid JSON" in deep.json()["error"]
            many = client.post("/v1/translate", json={"texts": ["one"] * 17})
            assert many.status_code == 413 and "17 sentences" in many.json()["error"]
            huge = client.post("/translate", content=b"x" * 2_000_000)
            assert huge.status_code == 413
            start = time.monotonic()
            ok = client.post("/translate", json={"q": lines[3], **PAIR})
            assert ok.json()["translatedText"] == offline[3]
            assert time.monotonic() - start < 30
    finally:
        stuck.close()


def test_sigterm_finishes_the_requests_in_flight_and_exits_0(checkpoint, lines):
    """Long requests are in flight when SIGTERM comes: each is answered in full, new
    connections are refused meanwhile, and the process exits 0."""
    slow = ServeProcess(checkpoint, "max_len_a=0", "max_len_b=100", "max_sentences=4")
    want = httpx.post(f"{slow.url}/translate", json={"q": lines[:12], **PAIR}, timeout=120).json()[
        "translatedText"
    ]
    answers: list[httpx.Response] = []

    def one_request() -> None:
        answers.append(
            httpx.post(f"{slow.url}/translate", json={"q": lines[:12], **PAIR}, timeout=120)
        )

    threads = [threading.Thread(target=one_request) for _ in range(8)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    queued = re.compile(r'^nmt_serve_queue_sentences\{model="en-de"\} (\S+)$', re.M)
    while time.monotonic() < deadline:  # all eight in flight (and this /metrics request)
        text = httpx.get(f"{slow.url}/metrics").text
        waiting = queued.search(text)
        # ... and sentences waiting for a batch of 4 (the queue depth metric sees them)
        if "nmt_serve_in_flight 9.0" in text and waiting and float(waiting.group(1)) > 0:
            break
        time.sleep(0.01)
    else:
        raise AssertionError("the requests were not in flight together")
    slow.terminate()
    time.sleep(0.5)  # uvicorn checks for the signal every 0.1 s, then closes its socket
    still_working = slow.proc.poll() is None
    if still_working:
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{slow.url}/health", timeout=5)
    for t in threads:
        t.join(120)
    assert slow.proc.wait(120) == 0, slow.output()
    assert still_working, "the requests finished before the signal; make them longer"
    assert len(answers) == 8
    assert all(a.status_code == 200 and a.json()["translatedText"] == want for a in answers)
    assert "SIGTERM: finishing the requests in flight" in slow.output()


def test_start_up_mistakes_are_one_line_errors(nmt_cli, checkpoint, tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        for args, needle in (
            ((f"checkpoint={checkpoint}", f"port={port}"), f"port={port}: already in use"),
            ((f"checkpoint={tmp_path / 'none.pt'}",), "none.pt: checkpoint not found"),
            ((), "checkpoint=null: no checkpoint given"),
            (("port=99999",), "port=99999: not a TCP port"),
            (
                ("host=no.such.host.invalid", f"checkpoint={checkpoint}"),
                "host=no.such.host.invalid",
            ),
            (("bogus=1",), "bogus"),
        ):
            code, out, err = nmt_cli("serve", *args)
            lines = err.strip().splitlines()
            assert code == 2 and len(lines) == 1, err
            assert lines[0].startswith("nmt-serve: error: ") and needle in lines[0], err
    finally:
        taken.close()


def test_a_checkpoint_that_fails_to_load_stops_the_server(tmp_path):
    broken = tmp_path / "broken.pt"
    broken.write_bytes(b"not a checkpoint")
    server = ServeProcess(broken, ready=False)
    assert server.proc.wait(120) == 2
    last = server.output().strip().splitlines()[-1]
    assert last.startswith("nmt-serve: error: ") and "broken.pt" in last, server.output()
