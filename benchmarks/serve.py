"""Benchmark `serve`: nmt-serve under load against offline nmt-generate, same model and text.

    .venv/bin/python benchmarks/serve.py --checkpoint runs/demo/checkpoint_best.pt \
        --input data/demo/test.en --threads 1 [--clients 1,8,32] [--json serve.json]

A bounded, closed-loop load generator (httpx, asyncio) on 127.0.0.1: at each level, that
many clients send one sentence per request (LibreTranslate's POST /translate) until every
sentence of the input is translated once. Per level it reports sentences/s, the ratio to
offline nmt-generate (the same sentences, checkpoint, beam and threads; its own throughput
line, model loading excluded), p50/p99 latency, and the mean decoding batch (from
/metrics). Besides: a direct Translator call per sentence (the latency a server adds to),
and the Translator on batches of as many random sentences as there are clients (the most
batching across that many clients can give). Offline runs before and after the server
runs; their mean is the reference. The server's translations are checked against
nmt-generate's, line for line.

Targets (issue 18): at 32 clients >= 0.8x offline throughput; at 1 client, p50 latency
within 10% of a direct Translator call.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

BIN = Path(sys.executable).parent
THROUGHPUT = re.compile(r"translated (\d+) sentences .* in ([\d.]+)s: ([\d.]+) sentences/s")
SERVING = re.compile(r"serving on (http://\S+)")
METRIC = re.compile(r'^nmt_serve_batch_sentences_(sum|count)\{model="[^"]*"\} ([\d.e+]+)$', re.M)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--input", required=True, help="text file, one sentence a line")
    parser.add_argument("--sentences", type=int, default=500, help="first N lines of --input")
    parser.add_argument("--clients", default="1,8,32", help="concurrency levels")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (both sides)")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--max-wait-ms", type=float, default=None, help="nmt-serve's max_wait_ms")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per level at most")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument(
        "--httpx", action="store_true", help="send the load with httpx (costs the client more CPU)"
    )
    args = parser.parse_args(argv)

    lines = Path(args.input).read_text(encoding="utf-8").splitlines()[: args.sentences]
    lines = [line for line in lines if line.strip()]
    levels = [int(c) for c in args.clients.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        text = Path(tmp) / "input.txt"
        text.write_text("\n".join(lines) + "\n", encoding="utf-8")
        before = offline(args, text, Path(tmp) / "offline.txt")
        reference = (Path(tmp) / "offline.txt").read_text(encoding="utf-8").splitlines()
        direct = direct_translator(args, lines, levels)
        served = asyncio.run(serve_levels(args, lines, levels, reference))
        after = offline(args, text, Path(tmp) / "offline2.txt")
    offline_rate = (before + after) / 2
    results = {
        "machine": f"{platform.node()} ({os.cpu_count()} CPUs), {args.device}",
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "command": " ".join([Path(sys.argv[0]).as_posix(), *(argv or sys.argv[1:])]),
        "sentences": len(lines),
        "offline_sentences_per_s": [round(before, 1), round(after, 1)],
        "direct_latency_ms": direct["latency_ms"],
        "levels": [],
    }
    for level in served:
        c = level["clients"]
        level["x_offline"] = round(level["sentences_per_s"] / offline_rate, 3)
        level["ideal_sentences_per_s"] = direct["batched"][c]
        results["levels"].append(level)
    print(report(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    return 0


def offline(args: argparse.Namespace, text: Path, output: Path) -> float:
    """nmt-generate's own sentences/s on the file (its throughput line)."""
    done = subprocess.run(
        [
            str(BIN / "nmt-generate"),
            f"checkpoint={args.checkpoint}",
            f"input={text}",
            f"output={output}",
            f"beam={args.beam}",
            f"threads={args.threads}",
            f"device={args.device}",
            "progress=false",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    found = THROUGHPUT.search(done.stderr)
    if found is None:
        raise SystemExit(f"serve.py: no throughput line from nmt-generate: {done.stderr[-500:]}")
    return float(found.group(3))


def direct_translator(args: argparse.Namespace, lines: list[str], levels: list[int]) -> dict:
    """A Translator in this process: latency of one sentence per call (p50 over up to 200
    calls), and throughput on batches of `level` consecutive sentences."""
    from nmt import Translator

    translator = Translator.from_checkpoint(
        args.checkpoint, device=args.device, threads=args.threads, beam=args.beam
    )
    translator.translate(lines[:8])  # warm up
    times = []
    for line in lines[:200]:
        start = time.perf_counter()
        translator.translate([line])
        times.append(time.perf_counter() - start)
    batched = {}
    for level in levels:
        start = time.perf_counter()
        for i in range(0, len(lines), level):
            translator.translate(lines[i : i + level])
        batched[level] = round(len(lines) / (time.perf_counter() - start), 1)
    return {"latency_ms": round(1000 * statistics.median(times), 2), "batched": batched}


async def serve_levels(
    args: argparse.Namespace, lines: list[str], levels: list[int], reference: list[str]
) -> list[dict]:
    command = [
        str(BIN / "nmt-serve"),
        f"checkpoint={args.checkpoint}",
        "port=0",
        f"beam={args.beam}",
        f"threads={args.threads}",
        f"device={args.device}",
        "access_log=false",
        "log_level=warning",
        f"max_request_sentences={max(levels)}",
    ]
    if args.max_wait_ms is not None:
        command.append(f"max_wait_ms={args.max_wait_ms}")
    server = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        url = await _ready(server)
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            languages = (await client.get("/languages")).json()
            pair = {"source": languages[0]["code"], "target": languages[0]["targets"][0]}
            out = []
            for clients in levels:
                await _load(url, lines[: 2 * clients], clients, pair, args.httpx)  # warm up
                out.append(await _level(client, url, lines, clients, pair, reference, args))
        return out
    finally:
        server.terminate()
        server.wait(60)


async def _ready(server: subprocess.Popen) -> str:
    """The server's URL once /health answers 200."""
    assert server.stderr is not None
    url = None
    deadline = time.monotonic() + 300
    while url is None:
        line = await asyncio.to_thread(server.stderr.readline)
        if not line:
            raise SystemExit(f"serve.py: nmt-serve exited ({server.wait()})")
        found = SERVING.search(line)
        url = found.group(1) if found else None
    asyncio.get_running_loop().run_in_executor(None, _drain, server.stderr)
    async with httpx.AsyncClient(base_url=url) as client:
        while (await client.get("/health")).status_code != 200:
            if time.monotonic() > deadline:
                raise SystemExit("serve.py: nmt-serve did not load its model in 300 s")
            await asyncio.sleep(0.2)
    return url


def _drain(stream) -> None:
    for line in stream:
        sys.stderr.write(line)


async def _load(
    url: str, lines: list[str], clients: int, pair: dict, use_httpx: bool
) -> tuple[list[str | None], list[float], float]:
    """`clients` closed-loop clients, each on its own keep-alive connection, one sentence
    per request (LibreTranslate's JSON), until every line is done."""
    outputs: list[str | None] = [None] * len(lines)
    latencies: list[float] = []
    todo = iter(range(len(lines)))

    async def one_client() -> None:
        async with _client(url, use_httpx) as post:
            for i in todo:
                start = time.perf_counter()
                answer = await post("/translate", {"q": lines[i], **pair})
                latencies.append(time.perf_counter() - start)
                outputs[i] = answer["translatedText"]

    start = time.perf_counter()
    await asyncio.gather(*(one_client() for _ in range(clients)))
    return outputs, latencies, time.perf_counter() - start


@contextlib.asynccontextmanager
async def _client(url: str, use_httpx: bool):
    """post(path, obj) -> the JSON answer, over one keep-alive connection. The plain one
    writes HTTP/1.1 itself: httpx spends ~1-4 ms of CPU per request, more than the server
    spends decoding a small model's sentence, and on a small machine the load generator
    would take the server's CPU."""
    if use_httpx:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:

            async def post_httpx(path: str, obj: dict) -> dict:
                response = await client.post(path, json=obj)
                response.raise_for_status()
                return response.json()

            yield post_httpx
        return
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host.strip("[]"), int(port))

    async def post_plain(path: str, obj: dict) -> dict:
        body = json.dumps(obj).encode()
        writer.write(
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        answer = json.loads(await reader.readexactly(length))
        if status != 200:
            raise SystemExit(f"serve.py: {path} answered {status}: {answer}")
        return answer

    try:
        yield post_plain
    finally:
        writer.close()


async def _level(
    client: httpx.AsyncClient,
    url: str,
    lines: list[str],
    clients: int,
    pair: dict,
    reference: list[str],
    args: argparse.Namespace,
) -> dict:
    before = await _batches(client)
    cpu = time.process_time()
    outputs, latencies, seconds = await asyncio.wait_for(
        _load(url, lines, clients, pair, args.httpx), args.timeout
    )
    client_cpu = time.process_time() - cpu
    after = await _batches(client)
    wrong = sum(o != r for o, r in zip(outputs, reference))
    if wrong:
        raise SystemExit(
            f"serve.py: {wrong} translations at {clients} clients differ from nmt-generate's"
        )
    latencies.sort()
    batches = after[1] - before[1]
    return {
        "clients": clients,
        "sentences_per_s": round(len(lines) / seconds, 1),
        "p50_ms": round(1000 * latencies[len(latencies) // 2], 2),
        "p99_ms": round(1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 2),
        "mean_batch": round((after[0] - before[0]) / batches, 1) if batches else None,
        "client_cpu_ms": round(1000 * client_cpu / len(lines), 2),
    }


async def _batches(client: httpx.AsyncClient) -> tuple[float, float]:
    """(sentences, batches) decoded so far, from /metrics."""
    text = (await client.get("/metrics")).text
    found = dict((kind, float(value)) for kind, value in METRIC.findall(text))
    return found.get("sum", 0.0), found.get("count", 0.0)


def report(results: dict) -> str:
    offline = sum(results["offline_sentences_per_s"]) / 2
    direct = results["direct_latency_ms"]
    rows = [
        f"serve benchmark, {results['sentences']} sentences, {results['machine']}, {results['date']}",
        f"command: {results['command']}",
        f"offline nmt-generate: {offline:.1f} sentences/s "
        f"(before/after: {results['offline_sentences_per_s']}); "
        f"direct Translator call: p50 {direct:.2f} ms per sentence",
        "",
        "| clients | sentences/s | x offline | p50 ms | p99 ms | p50 / direct | mean batch "
        "| Translator on batches of `clients` | load generator CPU per request |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for level in results["levels"]:
        rows.append(
            f"| {level['clients']} | {level['sentences_per_s']} | {level['x_offline']:.2f} "
            f"| {level['p50_ms']} | {level['p99_ms']} | {level['p50_ms'] / direct:.2f} "
            f"| {level['mean_batch']} | {level['ideal_sentences_per_s']} sentences/s "
            f"({level['ideal_sentences_per_s'] / offline:.2f}x) | {level['client_cpu_ms']} ms |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
