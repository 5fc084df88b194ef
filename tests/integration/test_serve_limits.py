"""nmt-serve's HTTP limits against a real process, with raw sockets: a huge URL is 414,
too many or too large headers are 431 (and the server's memory does not grow with a header
flood), a head or body that trickles in is 408 at its timeout, slow connections at
max_connections lock no client out, a body cut off is never translated, a Host not allowed
is 400, idle keep-alive connections close, query-string secrets stay out of the access log,
and a connection cap that the open-file limit cannot hold is refused at start.

Every wait is derived from the server's short timeouts below, not from this machine's speed.
"""

from __future__ import annotations

import json
import re
import resource
import select
import socket
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.integration.serve_process import NMT_SERVE, ServeProcess, train_checkpoint

HEADER_TIMEOUT = 1.0
BODY_TIMEOUT = 1.0
KEEP_ALIVE_TIMEOUT = 1.0
MAX_URL_BYTES = 1024
MAX_HEADER_BYTES = 4096
MAX_HEADERS = 20
MAX_CONNECTIONS = 8
LIMITS = [
    f"header_timeout={HEADER_TIMEOUT}",
    f"body_timeout={BODY_TIMEOUT}",
    f"keep_alive_timeout={KEEP_ALIVE_TIMEOUT}",
    f"max_url_bytes={MAX_URL_BYTES}",
    f"max_header_bytes={MAX_HEADER_BYTES}",
    f"max_headers={MAX_HEADERS}",
    f"max_connections={MAX_CONNECTIONS}",
    "allowed_hosts=['127.0.0.1','localhost']",
]
TRANSLATE = b'{"q": "I bought twenty-one books.", "source": "en", "target": "de"}'


@pytest.fixture(scope="module")
def checkpoint(demo_data_dir, tmp_path_factory) -> Path:
    return train_checkpoint(demo_data_dir, tmp_path_factory.mktemp("serve-limits-run"))


@pytest.fixture(scope="module")
def server(checkpoint):
    process = ServeProcess(checkpoint, *LIMITS)
    yield process
    assert process.stop() == 0, process.output()


def _address(server: ServeProcess) -> tuple[str, int]:
    host, port = server.url.split("//")[1].rsplit(":", 1)
    return host, int(port)


def _connect(server: ServeProcess, data: bytes = b"") -> socket.socket:
    sock = socket.create_connection(_address(server), timeout=30)
    if data:
        sock.sendall(data)
    return sock


def _answer(sock: socket.socket, within: float) -> bytes:
    """What the server sends until it closes the connection (or `within` seconds pass)."""
    got, deadline = b"", time.monotonic() + within
    while (left := deadline - time.monotonic()) > 0:
        if not select.select([sock], [], [], left)[0]:
            break
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        got += chunk
    return got


def _status(answer: bytes) -> int:
    assert answer.startswith(b"HTTP/1.1 "), answer[:200]
    return int(answer.split(b" ", 2)[1])


def _error(answer: bytes) -> str:
    return json.loads(answer.partition(b"\r\n\r\n")[2])["error"]


def _get(path: str, headers: bytes = b"Host: 127.0.0.1\r\n") -> bytes:
    return b"GET " + path.encode() + b" HTTP/1.1\r\n" + headers + b"\r\n"


def _rss_kb(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.M).group(1))


def _metric(url: str, name: str, **labels: str) -> float:
    """One sample of /metrics (0 when it has not appeared yet)."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    shown = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        sample, _, value = line.rpartition(" ")
        if sample == f"{name}{{{shown}}}" or (not shown and sample == name):
            return float(value)
    return 0.0


def _translate_requests(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return sum(
        float(v)
        for v in re.findall(r'^nmt_serve_requests_total\{route="/translate".*\} (\S+)$', text, re.M)
    )


def test_a_url_over_max_url_bytes_is_414(server):
    sock = _connect(server, _get("/health?pad=" + "a" * (MAX_URL_BYTES * 64)))
    answer = _answer(sock, 30)
    sock.close()
    assert _status(answer) == 414, answer[:300]
    assert "max_url_bytes=1024" in _error(answer)
    assert b"connection: close" in answer.lower()
    # a URL within the limit is served
    sock = _connect(server, _get("/health?pad=" + "a" * (MAX_URL_BYTES - 100)))
    assert _status(_answer(sock, 30)) == 200
    sock.close()


@pytest.mark.parametrize(
    "headers, option",
    [
        (b"".join(b"X-Many-%d: 1\r\n" % i for i in range(MAX_HEADERS + 1)), "max_headers=20"),
        (b"X-Huge: " + b"h" * (MAX_HEADER_BYTES * 16) + b"\r\n", "max_header_bytes=4096"),
        (b"".join(b"X-%d: %s\r\n" % (i, b"b" * 400) for i in range(12)), "max_header_bytes=4096"),
    ],
    ids=["count", "one-huge", "total"],
)
def test_headers_over_the_limits_are_431(server, headers, option):
    sock = _connect(server, _get("/health", b"Host: 127.0.0.1\r\n" + headers))
    answer = _answer(sock, 30)
    sock.close()
    assert _status(answer) == 431, answer[:300]
    assert option in _error(answer)


def test_headers_within_the_limits_are_served(server):
    headers = b"Host: 127.0.0.1\r\n" + b"".join(
        b"X-%d: %s\r\n" % (i, b"b" * 100) for i in range(18)
    )
    sock = _connect(server, _get("/health", headers))
    assert _status(_answer(sock, 30)) == 200
    sock.close()


def test_a_header_flood_does_not_grow_the_servers_memory(server):
    """64 MB of headers on one connection (the probe's flood): refused after the limit,
    the rest read and dropped, so the server's RSS stays far under the flood's size."""
    pid = server.proc.pid
    before = peak = _rss_kb(pid)
    flood = 64 << 20
    line = b"X-Flood: " + b"f" * 1000 + b"\r\n"
    chunk = line * 1024  # about 1 MB
    sock = _connect(server, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    sent = 0
    try:
        while sent < flood:
            sock.sendall(chunk)
            sent += len(chunk)
            peak = max(peak, _rss_kb(pid))
    except OSError:
        pass  # refused, and closed after lingering
    finally:
        sock.close()
    peak = max(peak, _rss_kb(pid))
    assert (peak - before) * 1024 < flood / 8, f"RSS {before} kB -> {peak} kB during the flood"
    assert httpx.get(f"{server.url}/health", timeout=30).status_code == 200


def test_a_trickling_head_is_408_at_header_timeout(server):
    """Slowloris: a header byte every quarter of header_timeout does not keep the
    connection: 408 once header_timeout has passed since it opened."""
    start = time.monotonic()
    sock = _connect(server, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
    answer = b""
    try:
        while time.monotonic() - start < 10 * HEADER_TIMEOUT:
            answer = _answer(sock, HEADER_TIMEOUT / 4)
            if answer:
                break
            sock.sendall(b"s")
    finally:
        sock.close()
    elapsed = time.monotonic() - start
    assert answer, f"still open after {elapsed:.1f} s of trickling"
    assert _status(answer) == 408 and "header_timeout=1.0" in _error(answer)
    assert elapsed >= HEADER_TIMEOUT


def test_a_connection_that_sends_nothing_is_closed_at_header_timeout(server):
    start = time.monotonic()
    sock = _connect(server)
    assert _answer(sock, 10 * HEADER_TIMEOUT) == b""  # closed, without a word
    sock.close()
    assert HEADER_TIMEOUT <= time.monotonic() - start < 10 * HEADER_TIMEOUT


def test_slow_connections_at_max_connections_lock_no_client_out(server):
    """max_connections slow clients hold every place: one more connection is answered 503
    at once (Retry-After, logged), and the slow ones are kicked at header_timeout, so a
    normal client retrying gets its 200 soon after, while the slow ones keep trickling."""
    stop = threading.Event()
    head = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
    slow = [_connect(server, head) for _ in range(MAX_CONNECTIONS)]
    opened = time.monotonic()
    answers: dict[int, bytes] = {}

    def trickle() -> None:
        while not stop.wait(HEADER_TIMEOUT / 4):
            for i, sock in enumerate(slow):
                try:
                    sock.sendall(b"s")
                except OSError:
                    pass
                if i not in answers and select.select([sock], [], [], 0)[0]:
                    answers[i] = _answer(sock, 1)

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    try:
        extra = _connect(server)
        busy = _answer(extra, HEADER_TIMEOUT / 2)  # before any slow one is kicked
        extra.close()
        assert _status(busy) == 503, busy[:300]
        assert b"retry-after: 1" in busy.lower()
        assert "max_connections=8" in _error(busy)
        while True:
            try:
                health = httpx.get(f"{server.url}/health", timeout=30)
            except httpx.TransportError:
                health = None
            if health is not None and health.status_code == 200:
                break
            assert time.monotonic() - opened < 5 * HEADER_TIMEOUT, "locked out"
            time.sleep(HEADER_TIMEOUT / 10)
        waited = time.monotonic() - opened
    finally:
        stop.set()
        thread.join()
        for sock in slow:
            sock.close()
    assert waited >= HEADER_TIMEOUT * 0.9  # the slow ones held every place until kicked
    assert [_status(answers[i]) for i in sorted(answers)] == [408] * len(answers)
    assert "answered 1 connection(s) 503 server busy: max_connections=8" in server.output()


def _partial_translate(server: ServeProcess) -> socket.socket:
    """A POST /translate whose body is valid JSON but shorter than its Content-Length."""
    return _connect(
        server,
        b"POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % (len(TRANSLATE) + 50) + TRANSLATE,
    )


def _wait_recorded(url: str, before: float, within: float) -> None:
    deadline = time.monotonic() + within
    while _translate_requests(url) <= before:
        assert time.monotonic() < deadline, "the request was never answered"
        time.sleep(0.1)


def test_a_body_cut_off_by_the_client_is_never_translated(server):
    url = server.url
    decoded = _metric(url, "nmt_serve_sentences_total", model="en-de")
    truncated = _metric(url, "nmt_serve_errors_total", route="/translate", kind="truncated")
    requests = _translate_requests(url)
    sock = _partial_translate(server)
    sock.shutdown(socket.SHUT_WR)  # the client is gone before its body's end
    _answer(sock, 10)
    sock.close()
    _wait_recorded(url, requests, 60)
    assert _metric(url, "nmt_serve_sentences_total", model="en-de") == decoded
    assert (
        _metric(url, "nmt_serve_errors_total", route="/translate", kind="truncated")
        == truncated + 1
    )
    served = httpx.post(f"{url}/translate", json=json.loads(TRANSLATE), timeout=60)
    assert served.status_code == 200 and served.json()["translatedText"]


def test_a_body_that_stops_arriving_is_408_at_body_timeout(server):
    url = server.url
    decoded = _metric(url, "nmt_serve_sentences_total", model="en-de")
    requests = _translate_requests(url)
    start = time.monotonic()
    sock = _partial_translate(server)
    answer = _answer(sock, 10 * BODY_TIMEOUT)
    sock.close()
    assert _status(answer) == 408 and "body_timeout=1.0" in _error(answer)
    assert BODY_TIMEOUT <= time.monotonic() - start < 10 * BODY_TIMEOUT
    _wait_recorded(url, requests, 60)
    assert _metric(url, "nmt_serve_sentences_total", model="en-de") == decoded


def test_a_slow_upload_does_not_hold_the_shutdown(checkpoint):
    """SIGTERM while a body trickles in: that request has not begun, so it is answered
    503 at once, and the server exits long before body_timeout or shutdown_timeout."""
    process = ServeProcess(checkpoint, "body_timeout=60", "shutdown_timeout=20")
    try:
        sock = _partial_translate(process)
        # in flight: the upload and this /metrics request
        deadline = time.monotonic() + 30
        while _metric(process.url, "nmt_serve_in_flight") < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        start = time.monotonic()
        process.terminate()
        answer = _answer(sock, 20)
        sock.close()
        assert answer and _status(answer) == 503, process.output()
        assert "shutting down" in _error(answer)
        process.proc.wait(20)
        assert time.monotonic() - start < 20 / 2
    finally:
        assert process.stop() == 0, process.output()


def test_a_host_not_allowed_is_400(server):
    sock = _connect(server, _get("/health", b"Host: evil.example\r\n"))
    answer = _answer(sock, 30)
    sock.close()
    assert _status(answer) == 400 and "'evil.example' is not a host" in _error(answer)
    sock = _connect(server, _get("/health", b"Host: localhost:5000\r\n"))
    assert _status(_answer(sock, 30)) == 200
    sock.close()


def test_an_idle_keep_alive_connection_closes_at_keep_alive_timeout(server):
    sock = _connect(server, _get("/health"))
    first = b""
    while b"\r\n\r\n" not in first:
        first += sock.recv(65536)
    length = int(re.search(rb"content-length: (\d+)", first, re.I).group(1))
    while len(first.partition(b"\r\n\r\n")[2]) < length:
        first += sock.recv(65536)
    start = time.monotonic()
    assert _status(first) == 200
    rest = _answer(sock, 10 * KEEP_ALIVE_TIMEOUT)  # until the server closes it
    sock.close()
    assert rest == b""
    # uvicorn's own default (5 s) is longer than this bound
    assert time.monotonic() - start < 4 * KEEP_ALIVE_TIMEOUT


def test_query_string_secrets_stay_out_of_the_access_log(server):
    query = "api_key=s3cret-one&token=s3cret-two&Key=s3cret-three&api%5Fkey=s3cret-4&q=visible"
    assert httpx.get(f"{server.url}/languages?{query}", timeout=30).status_code == 200
    deadline = time.monotonic() + 30
    while "q=visible" not in server.output():
        assert time.monotonic() < deadline, server.output()[-2000:]
        time.sleep(0.05)
    assert "s3cret" not in server.output()
    assert "/languages?api_key=***&token=***&Key=***&api%5Fkey=***&q=visible" in server.output()


def _limit_files(soft: int, hard: int):
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_connection_cap_the_open_file_limit_cannot_hold_is_refused(tmp_path):
    missing = tmp_path / "missing.pt"
    refused = subprocess.run(
        [str(NMT_SERVE), f"checkpoint={missing}", "max_connections=1000"],
        capture_output=True,
        text=True,
        preexec_fn=_limit_files(256, 256),
        timeout=120,
    )
    assert refused.returncode != 0
    assert "max_connections=1000: more than the open-file limit of 256" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    # a soft limit under the hard one is raised first: the cap fits, the next check speaks
    raised = subprocess.run(
        [str(NMT_SERVE), f"checkpoint={missing}", "max_connections=1000"],
        capture_output=True,
        text=True,
        preexec_fn=_limit_files(256, 4096),
        timeout=120,
    )
    assert raised.returncode != 0 and "checkpoint not found" in raised.stderr, raised.stderr
