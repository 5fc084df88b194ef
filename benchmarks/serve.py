"""Benchmark `serve`: nmt-serve under load against offline nmt-generate, same model and text.

    .venv/bin/python -m benchmarks.serve --checkpoint runs/demo/checkpoint_best.pt \\
        --input data/demo/test.en --threads 1 [--clients 1,8,32] [--rounds 3] [--json out.json]

A bounded, closed-loop load generator (asyncio) on 127.0.0.1: at each level, that many
clients, each on its own keep-alive connection, send one sentence per request
(LibreTranslate's POST /translate) until every sentence of the input is translated once.
Per level: sentences/s and its ratio to offline nmt-generate (the same sentences,
checkpoint, beam and threads; nmt-generate's own throughput line, model loading excluded),
p50/p99 latency, the mean decoding batch (from /metrics), the Translator itself on batches
of as many sentences as there are clients (in this process: the most that batching across
that many one-sentence clients can give), and CPU time per sentence, the server's (all its
threads) and the load generator's, against nmt-generate's (its run less a one-line run's).
On a shared machine CPU time drifts much less than wall time.

Latency at 1 client is measured paired: sentence by sentence, a direct Translator call in
this process, then the same sentence through the server; p50 of each.

The machine drifts (shared CPUs), so each round runs offline, then every level, then the
ceilings, and the report gives the median over rounds. The server's translations are
checked against nmt-generate's, line for line. `--httpx` sends the load with httpx instead
of the plain HTTP/1.1 client, which costs the load generator several times more CPU.

Targets (issue 18): at 32 clients >= 0.8x offline throughput; at 1 client, p50 latency
within 10% of a direct Translator call.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import common

NAME = "serve"
BIN = Path(sys.executable).parent
THROUGHPUT = re.compile(r"translated (\d+) sentences .* in ([\d.]+)s: ([\d.]+) sentences/s")
SERVING = re.compile(r"serving on (http://\S+)")
METRIC = re.compile(r'^nmt_serve_batch_sentences_(sum|count)\{model="[^"]*"\} ([\d.e+]+)$', re.M)


def build_parser() -> argparse.ArgumentParser:
    parser = common.parser(NAME, __doc__)
    parser.add_argument("--checkpoint", required=True, type=common.existing_file)
    parser.add_argument(
        "--input", required=True, type=common.existing_file, help="text file, one sentence a line"
    )
    parser.add_argument(
        "--sentences", type=common.positive_int, default=500, help="first N lines of --input"
    )
    parser.add_argument(
        "--clients", type=client_levels, default="1,8,32", help="concurrency levels"
    )
    parser.add_argument(
        "--rounds", type=common.positive_int, default=3, help="interleaved repetitions"
    )
    parser.add_argument(
        "--latency-sentences", type=common.positive_int, default=100, help="paired, 1 client"
    )
    parser.add_argument(
        "--threads", type=common.positive_int, default=1, help="torch threads (both sides)"
    )
    parser.add_argument("--beam", type=common.positive_int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--max-wait-ms", type=float, default=None, help="nmt-serve's max_wait_ms")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per level at most")
    parser.add_argument("--httpx", action="store_true", help="send the load with httpx")
    return parser


def client_levels(value: str) -> list[int]:
    """argparse type of --clients: '1,8,32'."""
    try:
        levels = [int(c) for c in value.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r}: not a comma-separated list of integers"
        ) from None
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"{value}: each level must be 1 or more")
    return levels


def run_benchmark(args: argparse.Namespace) -> dict:
    """The benchmark (common.main's `run`): measure, print the table, return the figures."""
    _httpx()  # missing: one line now, not a traceback after the first round
    results = asyncio.run(run(args))
    print(report(results))
    return results


def main(argv: list[str] | None = None) -> int:
    return common.main(NAME, build_parser, run_benchmark, argv)


def _httpx():
    """httpx (the server's test extra), or a BenchError saying how to install it."""
    try:
        import httpx
    except ImportError:
        raise common.BenchError(
            "httpx is not installed; pip install httpx (or the test extra: pip install -e '.[test]')"
        ) from None
    return httpx


async def run(args: argparse.Namespace) -> dict:
    from nmt import Translator

    lines = Path(args.input).read_text(encoding="utf-8").splitlines()[: args.sentences]
    lines = [line for line in lines if line.strip()]
    levels = args.clients
    translator = Translator.from_checkpoint(
        args.checkpoint, device=args.device, threads=args.threads, beam=args.beam
    )
    translator.translate(lines[:8])  # warm up
    rounds: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        text = Path(tmp) / "input.txt"
        text.write_text("\n".join(lines) + "\n", encoding="utf-8")
        output = Path(tmp) / "offline.txt"
        async with served(args, max(levels)) as (url, pair, pid):
            for _ in range(args.rounds):
                this: dict = {"offline": offline(args, text, output), "levels": {}}
                reference = output.read_text(encoding="utf-8").splitlines()
                for clients in levels:
                    await load(url, lines[: 2 * clients], clients, pair, args.httpx)  # warm up
                    this["levels"][clients] = await level(
                        url, pid, lines, clients, pair, reference, args
                    )
                this["ceiling"] = {c: batched(translator, lines, c) for c in levels}
                this["latency"] = await paired_latency(
                    url, translator, lines[: args.latency_sentences], pair
                )
                rounds.append(this)
    return summary(args, lines, levels, rounds)


def offline(args: argparse.Namespace, text: Path, output: Path) -> dict:
    """nmt-generate on the file: its own sentences/s (its throughput line), and its CPU
    time per sentence (the run's CPU less a one-line run's: start-up and loading out)."""
    one = text.with_name("one-line.txt")
    one.write_text(text.read_text(encoding="utf-8").splitlines()[0] + "\n", encoding="utf-8")
    cpu_one, _ = _generate(args, one, output.with_name("one-line.out"))
    cpu_all, stderr = _generate(args, text, output)
    found = THROUGHPUT.search(stderr)
    if found is None:
        raise common.BenchError(f"no throughput line from nmt-generate: {stderr[-500:]}")
    sentences = int(found.group(1))
    return {
        "sentences_per_s": float(found.group(3)),
        "cpu_ms": 1000 * (cpu_all - cpu_one) / max(sentences - 1, 1),
    }


def _generate(args: argparse.Namespace, text: Path, output: Path) -> tuple[float, str]:
    """(CPU seconds, stderr) of one nmt-generate run."""
    before = _children_cpu()
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
    return _children_cpu() - before, done.stderr


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _process_cpu(pid: int) -> float:
    """CPU seconds of a running process, all its threads (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def batched(translator, lines: list[str], size: int) -> float:
    """The Translator's sentences/s on consecutive batches of `size` sentences."""
    start = time.perf_counter()
    for i in range(0, len(lines), size):
        translator.translate(lines[i : i + size])
    return len(lines) / (time.perf_counter() - start)


async def paired_latency(url: str, translator, lines: list[str], pair: dict) -> dict:
    """Per sentence a direct Translator call, then the same sentence through the server."""
    direct, server = [], []
    async with _client(url, use_httpx=False) as post:
        for line in lines:
            start = time.perf_counter()
            translator.translate([line])
            direct.append(time.perf_counter() - start)
            start = time.perf_counter()
            await post("/translate", {"q": line, **pair})
            server.append(time.perf_counter() - start)
    return {
        "direct_p50_ms": 1000 * statistics.median(direct),
        "server_p50_ms": 1000 * statistics.median(server),
    }


@contextlib.asynccontextmanager
async def served(args: argparse.Namespace, most_clients: int):
    """nmt-serve on a free loopback port, ready; yields (url, {source, target}, pid)."""
    command = [
        str(BIN / "nmt-serve"),
        f"checkpoint={args.checkpoint}",
        "port=0",
        f"beam={args.beam}",
        f"threads={args.threads}",
        f"device={args.device}",
        "access_log=false",
        "log_level=warning",
        f"max_request_sentences={max(most_clients, 128)}",
    ]
    if args.max_wait_ms is not None:
        command.append(f"max_wait_ms={args.max_wait_ms}")
    server = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        url = await _ready(server)
        async with _httpx().AsyncClient(base_url=url) as client:
            languages = (await client.get("/languages")).json()
        pair = {"source": languages[0]["code"], "target": languages[0]["targets"][0]}
        yield url, pair, server.pid
    finally:
        server.terminate()
        server.wait(60)


async def _ready(server: subprocess.Popen) -> str:
    """The server's URL once /health answers 200."""
    assert server.stderr is not None
    url = None
    while url is None:
        line = await asyncio.to_thread(server.stderr.readline)
        if not line:
            raise common.BenchError(f"nmt-serve exited ({server.wait()})")
        found = SERVING.search(line)
        url = found.group(1) if found else None
    asyncio.get_running_loop().run_in_executor(None, _drain, server.stderr)
    deadline = time.monotonic() + 300
    async with _httpx().AsyncClient(base_url=url) as client:
        while (await client.get("/health")).status_code != 200:
            if time.monotonic() > deadline:
                raise common.BenchError("nmt-serve did not load its model in 300 s")
            await asyncio.sleep(0.2)
    return url


def _drain(stream) -> None:
    for line in stream:
        sys.stderr.write(line)


async def load(
    url: str, lines: list[str], clients: int, pair: dict, use_httpx: bool
) -> tuple[list[str | None], list[float], float]:
    """`clients` closed-loop clients, each on its own keep-alive connection, one sentence
    per request, until every line is done."""
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
    writes HTTP/1.1 itself: httpx spends 1-4 ms of CPU per request, more than the server
    spends on a small model's sentence, and on a small machine the load generator would
    take the server's CPU."""
    if use_httpx:
        async with _httpx().AsyncClient(base_url=url, timeout=60) as client:

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
            raise common.BenchError(f"{path} answered {status}: {answer}")
        return answer

    try:
        yield post_plain
    finally:
        writer.close()


async def level(
    url: str,
    pid: int,
    lines: list[str],
    clients: int,
    pair: dict,
    reference: list[str],
    args: argparse.Namespace,
) -> dict:
    before = await _batches(url)
    cpu, server_cpu = time.process_time(), _process_cpu(pid)
    outputs, latencies, seconds = await asyncio.wait_for(
        load(url, lines, clients, pair, args.httpx), args.timeout
    )
    client_cpu, server_cpu = time.process_time() - cpu, _process_cpu(pid) - server_cpu
    after = await _batches(url)
    wrong = sum(o != r for o, r in zip(outputs, reference))
    if wrong:
        raise common.BenchError(f"{wrong} translations at {clients} clients differ from offline")
    latencies.sort()
    batches = after[1] - before[1]
    return {
        "sentences_per_s": len(lines) / seconds,
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
        "mean_batch": (after[0] - before[0]) / batches if batches else 0.0,
        "client_cpu_ms": 1000 * client_cpu / len(lines),
        "server_cpu_ms": 1000 * server_cpu / len(lines),
    }


async def _batches(url: str) -> tuple[float, float]:
    """(sentences, batches) decoded so far, from /metrics."""
    async with _httpx().AsyncClient(base_url=url) as client:
        text = (await client.get("/metrics")).text
    found = dict((kind, float(value)) for kind, value in METRIC.findall(text))
    return found.get("sum", 0.0), found.get("count", 0.0)


def summary(args: argparse.Namespace, lines: list[str], levels: list[int], rounds: list) -> dict:
    """Medians over rounds; ratios per round first (each against its own offline run)."""

    def med(values) -> float:
        return round(statistics.median(values), 2)

    out: dict = {
        "machine": f"{common.cpu_model()} ({os.cpu_count()} CPUs), {args.device}, "
        f"{args.threads} torch thread(s)",
        "date": common.utc_now(),
        "sentences": len(lines),
        "rounds": len(rounds),
        "offline_sentences_per_s": med(r["offline"]["sentences_per_s"] for r in rounds),
        "offline_cpu_ms": med(r["offline"]["cpu_ms"] for r in rounds),
        "direct_p50_ms": med(r["latency"]["direct_p50_ms"] for r in rounds),
        "server_1_client_p50_ms": med(r["latency"]["server_p50_ms"] for r in rounds),
        "latency_ratio": med(
            r["latency"]["server_p50_ms"] / r["latency"]["direct_p50_ms"] for r in rounds
        ),
        "levels": [],
        "raw": rounds,
    }
    for c in levels:
        per = [r["levels"][c] for r in rounds]
        out["levels"].append(
            {
                "clients": c,
                "sentences_per_s": med(p["sentences_per_s"] for p in per),
                "x_offline": med(
                    r["levels"][c]["sentences_per_s"] / r["offline"]["sentences_per_s"]
                    for r in rounds
                ),
                "p50_ms": med(p["p50_ms"] for p in per),
                "p99_ms": med(p["p99_ms"] for p in per),
                "mean_batch": med(p["mean_batch"] for p in per),
                "ceiling_x_offline": med(
                    r["ceiling"][c] / r["offline"]["sentences_per_s"] for r in rounds
                ),
                "client_cpu_ms": med(p["client_cpu_ms"] for p in per),
                "server_cpu_ms": med(p["server_cpu_ms"] for p in per),
            }
        )
    return out


def report(results: dict) -> str:
    header = [
        "clients",
        "sentences/s",
        "x offline",
        "p50 ms",
        "p99 ms",
        "mean batch",
        "Translator on batches of `clients`, x offline",
        "CPU ms per sentence: server (+ load generator)",
    ]
    rows = [
        [
            lv["clients"],
            lv["sentences_per_s"],
            f"{lv['x_offline']:.2f}",
            lv["p50_ms"],
            lv["p99_ms"],
            lv["mean_batch"],
            f"{lv['ceiling_x_offline']:.2f}",
            f"{lv['server_cpu_ms']} (+ {lv['client_cpu_ms']})",
        ]
        for lv in results["levels"]
    ]
    lines = [
        f"serve benchmark: {results['sentences']} sentences, {results['machine']}, "
        f"{results['date']}, median of {results['rounds']} interleaved rounds",
        f"offline nmt-generate: {results['offline_sentences_per_s']} sentences/s, "
        f"{results['offline_cpu_ms']} ms of CPU per sentence",
        f"1 client, paired: p50 {results['server_1_client_p50_ms']} ms through the server, "
        f"{results['direct_p50_ms']} ms by a direct Translator call "
        f"(ratio {results['latency_ratio']:.2f})",
        "",
        common.markdown_table(header, rows),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
