#!/usr/bin/env python3
"""A load generator for `microllm serve` (or any OpenAI-compatible server), standard library only.

N concurrent clients (threads, default 64) for D seconds (default 60): each repeatedly POSTs /v1/completions
(/v1/chat/completions with --chat) with "stream": true, a random prompt (from a built-in list, or
--prompt-words random words), max_tokens (default 64) and temperature 0, and reads the server-sent events
until `data: [DONE]`. A request started before the deadline runs to its end; none starts after it.

Reported (markdown table, --json FILE too): requests completed, errors (a status other than 200, a malformed
event, an error object in the stream, a missing [DONE], a finish_reason other than OpenAI's such as
"cancelled", a connection error or timeout: the first few are printed), generated tokens/s over the wall
time (tokens from the usage chunk, asked for with stream_options.include_usage; counted as content chunks when a
server sends no usage),
time to first token (from sending the request to the first chunk with text) p50/p95/max, the gaps between content chunks (inter-token latency when each chunk carries
one token; a server may put several tokens in a chunk, see chunks/token) p50/p95, and the time per output
token of each request after its first ((last - first chunk) / (tokens - 1)) p50/p95; the time to first token
of each client's first request apart (the burst at the start: every client sends at once). With microllm serve
also the mean batch size and the server's own time to first token (from a request's arrival; the histogram
of /metrics, so each quantile as the bucket bound that covers it): the client's figure less the server's is
the time outside the engine (connection, HTTP threads, this script). Exit code 1 if any request failed (or
none completed). After the run it waits (--settle-timeout) until /metrics shows no request running and no KV
block held, and counts it an error if that does not come. --disconnect-fraction F makes that share of the
clients leave every request half-way, streaming (closed after a few chunks) and not (closed after 0.05-0.5 s
without an answer) in turn: the server must cancel them all and free their blocks.

    python3 benchmarks/serve_load.py --url http://127.0.0.1:8080 [--clients 64] [--duration 60] [--max-tokens 64]
    python3 benchmarks/serve_load.py --spawn "microllm serve --model DIR --port 0 --device cuda --dtype bf16" ...

--spawn starts the server itself (its stderr to --server-log), takes the address from its
"http://HOST:PORT" line (or --url), waits for GET /health, and stops it with SIGTERM at the end. microllm serve
serves --http-threads connections at once (default 16): give it at least --clients, or the rest wait in the
accept queue and their waiting counts in time to first token.
"""
import argparse
import datetime
import http.client
import json
import math
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "Write a haiku about the morning sun.",
    "Explain why the sky is blue in one paragraph.",
    "List three uses of a paperclip:",
    "The quick brown fox",
    "def fibonacci(n):",
    "In 1492, Columbus",
    "The most important thing about learning a language is",
    "Translate to French: Good evening, how are you?",
    "Here is a recipe for pancakes:",
    "The three laws of thermodynamics are",
    "Dear diary, today I",
    "A short story about a robot who learns to paint:",
    "Q: What is 17 times 23?\nA:",
    "Summarize the plot of Hamlet.",
]

WORDS = ("time person year way day thing man world life hand part child eye woman place work week case point "
         "government company number group problem fact river mountain light water stone garden window music "
         "letter engine market city road bird green quick slow small bright cold warm open close read write "
         "build carry follow speak listen").split()

MAX_ERRORS_PRINTED = 5
FINISH_REASONS = ("stop", "length", "content_filter", "tool_calls")  # OpenAI's; anything else is an error


def percentile(values, q):
    """Linear interpolation between closest ranks (numpy's default); None for no values."""
    if not values:
        return None
    v = sorted(values)
    pos = (len(v) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.completed = 0
        self.errors = []  # (seconds since start, text)
        self.completion_tokens = 0
        self.prompt_tokens = 0
        self.chunks = 0
        self.usage_missing = 0
        self.finish_reasons = {}
        self.ttft = []
        self.ttft_first = []  # each client's first request: the start's burst
        self.gaps = []
        self.tpot = []
        self.latency = []
        self.abandoned = 0  # --disconnect-fraction: requests whose client left half-way
        self.finished_before_leaving = 0
        self.after_run = None  # /metrics once the run's requests are gone: running, KV blocks used, seconds

    def error(self, start, text):
        with self.lock:
            self.errors.append((time.perf_counter() - start, text))


def make_body(args, rng):
    if args.prompt_words > 0:
        prompt = " ".join(rng.choice(WORDS) for _ in range(args.prompt_words))
    else:
        prompt = rng.choice(PROMPTS)
    body = {"max_tokens": args.max_tokens, "temperature": args.temperature, "stream": True,
            "stream_options": {"include_usage": True}}
    if args.model:
        body["model"] = args.model
    if args.chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return body


def one_request(args, url, rng):
    """One streamed request. Returns a dict of its figures; raises RuntimeError (or OSError) on any fault."""
    path = "/v1/chat/completions" if args.chat else "/v1/completions"
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if args.api_key:
        headers["Authorization"] = f"Bearer {args.api_key}"
    body = json.dumps(make_body(args, rng))
    conn = http.client.HTTPConnection(url.hostname, url.port or 80, timeout=args.request_timeout)
    try:
        sent = time.perf_counter()
        conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        if response.status != 200:
            raise RuntimeError(f"status {response.status}: {response.read(300).decode(errors='replace')!r}")
        ctype = response.getheader("Content-Type", "")
        if not ctype.startswith("text/event-stream"):
            raise RuntimeError(f"Content-Type {ctype!r}, not text/event-stream")
        content_times, chunks, done, usage, finish = [], 0, False, None, None
        for raw in response:
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            if not line or line.startswith(":"):
                continue  # event separators, keep-alive comments
            if done:
                raise RuntimeError(f"a line after [DONE]: {line[:200]!r}")
            if not line.startswith("data: "):
                raise RuntimeError(f"not a data line: {line[:200]!r}")
            data = line[len("data: "):]
            if data == "[DONE]":
                done = True
                continue
            try:
                event = json.loads(data)
            except json.JSONDecodeError as e:
                raise RuntimeError(f"malformed event ({e}): {data[:200]!r}") from None
            if "error" in event:
                raise RuntimeError(f"error event: {json.dumps(event['error'])[:300]}")
            choices = event.get("choices")
            if event.get("usage"):
                usage = event["usage"]
            if choices == [] and usage is not None:
                continue  # the usage chunk (stream_options.include_usage)
            if not isinstance(choices, list) or not choices:
                raise RuntimeError(f"an event without choices: {data[:200]!r}")
            choice = choices[0]
            text = (choice.get("delta") or {}).get("content") if args.chat else choice.get("text")
            if text is not None and not isinstance(text, str):
                raise RuntimeError(f"text is not a string: {data[:200]!r}")
            now = time.perf_counter()
            if text:
                content_times.append(now)
                chunks += 1
            if choice.get("finish_reason"):
                finish = choice["finish_reason"]
                if not content_times:
                    content_times.append(now)  # no text at all (e.g. an immediate stop): the end is the first
        ended = time.perf_counter()
        if not done:
            raise RuntimeError(f"the stream ended without [DONE] after {chunks} content chunks")
        if finish is None:
            raise RuntimeError("no chunk had a finish_reason")
        if finish not in FINISH_REASONS:
            raise RuntimeError(f"finish_reason {finish!r} after {chunks} content chunks")
        return {"sent": sent, "ended": ended, "content_times": content_times, "chunks": chunks, "usage": usage,
                "finish": finish}
    finally:
        conn.close()


def abandoned_request(args, url, rng, streaming):
    """A request whose client leaves half-way: a stream closed after a few content chunks, or a non-streaming
    request (max_tokens --leave-max-tokens) whose connection is closed after 0.05-0.5 s without an answer.
    Returns True when the client left before the end (False: the server finished first)."""
    path = "/v1/chat/completions" if args.chat else "/v1/completions"
    headers = {"Content-Type": "application/json"}
    if args.api_key:
        headers["Authorization"] = f"Bearer {args.api_key}"
    body = make_body(args, rng)
    body["max_tokens"] = args.leave_max_tokens
    if not streaming:
        body["stream"] = False
        del body["stream_options"]
    patience = 0.05 + 0.45 * rng.random()
    conn = http.client.HTTPConnection(url.hostname, url.port or 80,
                                      timeout=args.request_timeout if streaming else patience)
    try:
        conn.request("POST", path, body=json.dumps(body), headers=headers)
        try:
            response = conn.getresponse()
        except (TimeoutError, OSError):
            return True  # no answer within its patience: it leaves
        if response.status != 200:
            raise RuntimeError(f"status {response.status}: {response.read(300).decode(errors='replace')!r}")
        if not streaming:
            response.read()
            return False
        wanted, seen = 1 + rng.randrange(8), 0
        for raw in response:
            line = raw.decode("utf-8", errors="replace")
            if line.startswith("data: [DONE]"):
                return False
            if line.startswith("data: {") and ('"text"' in line or '"content"' in line):
                seen += 1
                if seen >= wanted:
                    return True  # the connection closes below, mid-stream
        return False
    finally:
        conn.close()


def client(index, args, url, stats, clock, barrier):
    rng = random.Random(args.seed * 1000003 + index)
    barrier.wait()  # the main thread sets the clock before it arrives, last
    start, deadline = clock["start"], clock["deadline"]
    first = True
    leaver = index < round(args.disconnect_fraction * args.clients)
    left_streams = 0
    while time.perf_counter() < deadline:
        if leaver:
            left_streams += 1
            try:
                left = abandoned_request(args, url, rng, streaming=left_streams % 2 == 1)
            except Exception as e:  # noqa: BLE001
                stats.error(start, f"client {index} (leaving): {type(e).__name__}: {e}")
                time.sleep(0.05)
                continue
            with stats.lock:
                stats.abandoned += 1 if left else 0
                stats.finished_before_leaving += 0 if left else 1
            continue
        try:
            r = one_request(args, url, rng)
        except Exception as e:  # noqa: BLE001 - every fault is an error of the run, counted and reported
            stats.error(start, f"client {index}: {type(e).__name__}: {e}")
            time.sleep(0.05)  # a refusing server does not turn the loop into a busy one
            continue
        times = r["content_times"]
        usage = r["usage"] or {}
        tokens = usage.get("completion_tokens")
        with stats.lock:
            stats.completed += 1
            stats.chunks += r["chunks"]
            if isinstance(tokens, int):
                stats.completion_tokens += tokens
                stats.prompt_tokens += int(usage.get("prompt_tokens", 0))
            else:
                tokens = r["chunks"]
                stats.completion_tokens += tokens
                stats.usage_missing += 1
            stats.finish_reasons[r["finish"]] = stats.finish_reasons.get(r["finish"], 0) + 1
            stats.latency.append(r["ended"] - r["sent"])
            if times:
                stats.ttft.append(times[0] - r["sent"])
                if first:
                    stats.ttft_first.append(times[0] - r["sent"])
                first = False
                stats.gaps.extend(b - a for a, b in zip(times, times[1:]))
                if tokens and tokens > 1 and len(times) > 1:
                    stats.tpot.append((times[-1] - times[0]) / (tokens - 1))


def http_get(url, path, timeout=5.0):
    conn = http.client.HTTPConnection(url.hostname, url.port or 80, timeout=timeout)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read().decode(errors="replace")
    finally:
        conn.close()


def metric_values(url, names):
    """The values of these /metrics lines (gauges and counters without labels); {} when unavailable."""
    try:
        status, text = http_get(url, "/metrics")
    except OSError:
        return {}
    if status != 200:
        return {}
    values = {}
    for line in text.splitlines():
        parts = line.split(" ")
        if len(parts) == 2 and parts[0] in names:
            values[parts[0]] = float(parts[1])
    return values


def wait_until_idle(url, timeout):
    """Polls /metrics until no request runs and no KV block is held; returns (running, blocks used, blocks total,
    seconds waited) as last seen, or None when the server has no such metrics."""
    names = ("microllm_requests_running", "microllm_kv_blocks_used", "microllm_kv_blocks_total")
    start = time.perf_counter()
    while True:
        v = metric_values(url, names)
        if len(v) < len(names):
            return None
        waited = time.perf_counter() - start
        if (v["microllm_requests_running"] == 0 and v["microllm_kv_blocks_used"] == 0) or waited > timeout:
            return (int(v["microllm_requests_running"]), int(v["microllm_kv_blocks_used"]),
                    int(v["microllm_kv_blocks_total"]), waited)
        time.sleep(0.1)


def server_metrics(url):
    """From microllm serve's /metrics: (mean batch size, time-to-first-token quantiles), each None when absent.
    The quantiles {"p50", "p95", "max": seconds, "count": requests} are histogram bucket bounds: the smallest
    bound whose cumulative count covers the quantile (None past the last finite bound)."""
    try:
        status, text = http_get(url, "/metrics")
    except OSError:
        return None, None
    if status != 200:
        return None, None
    values, buckets = {}, []
    for line in text.splitlines():
        m = re.match(r"^(microllm_batches_total|microllm_batched_requests_total) ([0-9.eE+]+)$", line)
        if m:
            values[m.group(1)] = float(m.group(2))
        m = re.match(r'^microllm_time_to_first_token_seconds_bucket\{le="([^"]+)"\} ([0-9.eE+]+)$', line)
        if m:
            buckets.append((float(m.group(1)), float(m.group(2))))  # "+Inf" parses as inf
    batches = values.get("microllm_batches_total")
    batching = values["microllm_batched_requests_total"] / batches if batches else None
    ttft = None
    if buckets and buckets[-1][1] > 0:
        buckets.sort()
        count = buckets[-1][1]
        def bound(q):
            return next(le for le, cumulative in buckets if cumulative >= q * count)
        ttft = {"p50": bound(0.5), "p95": bound(0.95), "max": bound(1.0), "count": int(count)}
        ttft = {k: None if isinstance(v, float) and math.isinf(v) else v for k, v in ttft.items()}  # JSON has no inf
    return batching, ttft


class SpawnedServer:
    """`--spawn COMMAND`: stderr + stdout to a log file; stopped with SIGTERM (SIGKILL after 30 s)."""

    def __init__(self, command, log_path):
        self.log_path = log_path
        self.log = open(log_path, "wb")
        print(f"$ {command}", file=sys.stderr, flush=True)
        # In this process group: `timeout` and Ctrl-C reach the server too if this script dies first.
        self.proc = subprocess.Popen(shlex.split(command), stdout=self.log, stderr=subprocess.STDOUT)

    def log_text(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def wait_ready(self, url, timeout):
        """Polls the log for the address and then /health; returns the URL (parsed) or raises RuntimeError."""
        end = time.monotonic() + timeout
        address = None
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}:\n{self.log_text()[-3000:]}")
            if address is None:
                m = re.search(r"http://([0-9A-Za-z.\-\[\]:]+?):(\d+)", self.log_text())
                if m:
                    address = urllib.parse.urlparse(f"http://{m.group(1)}:{m.group(2)}")
                elif url is not None:
                    address = url
            if address is not None:
                try:
                    status, _ = http_get(address, "/health", timeout=2)
                    if status == 200:
                        return address
                except OSError:
                    pass
            time.sleep(0.1)
        raise RuntimeError(f"the server was not ready (GET /health) within {timeout} s:\n{self.log_text()[-3000:]}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def fmt_ms(seconds):
    return "-" if seconds is None else f"{seconds * 1000:.1f} ms"


def fmt_bound(seconds):
    return "past the last bucket" if seconds is None else f"<= {seconds * 1000:g} ms"


def report(args, url, stats, wall, batching, server_ttft, server_note):
    command = shlex.join(["python3"] + sys.argv)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    tokens = stats.completion_tokens
    endpoint = "/v1/chat/completions" if args.chat else "/v1/completions"
    summary = {
        "command": command, "date": now, "url": urllib.parse.urlunparse(url), "endpoint": endpoint,
        "clients": args.clients, "duration_s": args.duration, "max_tokens": args.max_tokens,
        "wall_s": wall, "requests_completed": stats.completed, "errors": len(stats.errors),
        "error_samples": [text for _, text in stats.errors[:MAX_ERRORS_PRINTED]],
        "completion_tokens": tokens, "prompt_tokens": stats.prompt_tokens,
        "tokens_per_second": tokens / wall if wall > 0 else 0.0,
        "requests_per_second": stats.completed / wall if wall > 0 else 0.0,
        "ttft_s": {"p50": percentile(stats.ttft, 50), "p95": percentile(stats.ttft, 95),
                   "max": max(stats.ttft) if stats.ttft else None},
        "ttft_first_request_s": {"p50": percentile(stats.ttft_first, 50),
                                 "max": max(stats.ttft_first) if stats.ttft_first else None},
        "server_ttft_bucket_s": server_ttft,
        "chunk_gap_s": {"p50": percentile(stats.gaps, 50), "p95": percentile(stats.gaps, 95)},
        "tpot_s": {"p50": percentile(stats.tpot, 50), "p95": percentile(stats.tpot, 95)},
        "latency_s": {"p50": percentile(stats.latency, 50), "p95": percentile(stats.latency, 95)},
        "chunks_per_token": stats.chunks / tokens if tokens else None,
        "usage_missing": stats.usage_missing, "finish_reasons": stats.finish_reasons,
        "server_mean_batch": batching,
        "disconnect_fraction": args.disconnect_fraction, "abandoned_requests": stats.abandoned,
        "finished_before_leaving": stats.finished_before_leaving,
        "after_run": None if stats.after_run is None else dict(zip(
            ("requests_running", "kv_blocks_used", "kv_blocks_total", "seconds_waited"), stats.after_run)),
    }
    s = summary
    rows = [
        ("requests completed", f"{s['requests_completed']:,} ({s['requests_per_second']:.2f}/s)"),
        ("errors", f"{s['errors']:,}"),
        ("generated tokens", f"{tokens:,}" + (f" ({stats.usage_missing} requests without usage: chunks counted)"
                                              if stats.usage_missing else "")),
        ("generated tokens/s (aggregate)", f"{s['tokens_per_second']:,.1f}"),
        ("time to first token p50 / p95 / max", " / ".join(fmt_ms(s["ttft_s"][k]) for k in ("p50", "p95", "max"))),
        ("... of each client's first request p50 / max",
         " / ".join(fmt_ms(s["ttft_first_request_s"][k]) for k in ("p50", "max"))),
        ("... in the server (/metrics buckets) p50 / p95 / max",
         "-" if server_ttft is None else " / ".join(fmt_bound(server_ttft[k]) for k in ("p50", "p95", "max"))),
        ("inter-token latency (gap between content chunks) p50 / p95",
         " / ".join(fmt_ms(s["chunk_gap_s"][k]) for k in ("p50", "p95"))),
        ("time per output token after the first p50 / p95", " / ".join(fmt_ms(s["tpot_s"][k]) for k in ("p50", "p95"))),
        ("request latency p50 / p95", " / ".join(fmt_ms(s["latency_s"][k]) for k in ("p50", "p95"))),
        ("content chunks per token", "-" if s["chunks_per_token"] is None else f"{s['chunks_per_token']:.2f}"),
        ("finish reasons", ", ".join(f"{k} {v}" for k, v in sorted(stats.finish_reasons.items())) or "-"),
        ("server mean batch (/metrics)", "-" if batching is None else f"{batching:.2f}"),
    ]
    if args.disconnect_fraction > 0:
        rows.append(("requests abandoned half-way (streaming and not, alternately)",
                     f"{stats.abandoned:,} by {round(args.disconnect_fraction * args.clients)} clients"
                     + (f" ({stats.finished_before_leaving} finished before their client left)"
                        if stats.finished_before_leaving else "")))
    if stats.after_run is not None:
        running, used, total, waited = stats.after_run
        rows.append(("after the run (/metrics): requests running, KV blocks used",
                     f"{running}, {used} of {total} (after {waited:.2f} s)"))
    lines = [
        f"# Serve load: {args.clients} clients, {args.duration:g} s ({now})", "",
        f"Command: `{command}`",
        f"Server: {s['url']}{endpoint}" + (f" ({server_note})" if server_note else ""),
        f"Each client: stream true, max_tokens {args.max_tokens}, temperature {args.temperature:g}, "
        + (f"{args.prompt_words} random words" if args.prompt_words > 0 else f"one of {len(PROMPTS)} built-in prompts")
        + f"; wall time {wall:.1f} s (requests started before the deadline ran to their end).", "",
        "| metric | value |", "|---|---|",
    ] + [f"| {name} | {value} |" for name, value in rows]
    if stats.errors:
        lines += ["", f"First errors (of {len(stats.errors)}):"]
        lines += [f"- at {t:.2f} s: {text}" for t, text in stats.errors[:MAX_ERRORS_PRINTED]]
    return "\n".join(lines) + "\n", summary


def interrupted(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--url", help="the server's base URL (default http://127.0.0.1:8080; with --spawn: "
                                      "taken from the server's log when it prints one)")
    parser.add_argument("--clients", type=int, default=64, help="concurrent clients")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds during which requests start")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--chat", action="store_true", help="POST /v1/chat/completions instead of /v1/completions")
    parser.add_argument("--prompt-words", type=int, default=0, help="random prompts of this many words (0: built-in)")
    parser.add_argument("--model", default="", help="the request's model field (microllm serve: its --model-name)")
    parser.add_argument("--disconnect-fraction", type=float, default=0.0,
                        help="this share of the clients leave each request half-way, streaming and not in turn")
    parser.add_argument("--leave-max-tokens", type=int, default=1024,
                        help="max_tokens of the requests that are left half-way")
    parser.add_argument("--settle-timeout", type=float, default=30.0,
                        help="seconds for the server to free every request and KV block after the run")
    parser.add_argument("--api-key", default="")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--request-timeout", type=float, default=120.0, help="seconds without a byte from the server")
    parser.add_argument("--spawn", help="a server command to start (e.g. \"microllm serve --model DIR --port 0\")")
    parser.add_argument("--server-log", help="--spawn: the server's output (default a temporary file)")
    parser.add_argument("--startup-timeout", type=float, default=300.0, help="--spawn: seconds until /health")
    parser.add_argument("--min-completed", type=int, default=1, help="fewer completed requests is a failure")
    parser.add_argument("--out", help="also write the markdown table to this file")
    parser.add_argument("--json", help="also write the figures as JSON to this file")
    args = parser.parse_args()
    if args.clients < 1 or args.duration <= 0 or args.max_tokens < 1:
        parser.error("--clients, --duration and --max-tokens must be positive")
    if not 0 <= args.disconnect_fraction < 1:
        parser.error("--disconnect-fraction must be in [0, 1)")
    url = urllib.parse.urlparse(args.url.rstrip("/")) if args.url else None

    server, server_note = None, ""
    # SIGTERM (`timeout`, a job controller) ends the run as Ctrl-C does: the spawned server is stopped on the way
    # out and the figures so far are reported.
    signal.signal(signal.SIGTERM, interrupted)
    stats = Stats()
    start = time.perf_counter()
    wall, batching, server_ttft = 0.0, None, None
    try:
        if args.spawn:
            log_path = args.server_log or os.path.join(tempfile.mkdtemp(prefix="serve-load-"), "server.log")
            server = SpawnedServer(args.spawn, log_path)
            try:
                url = server.wait_ready(url, args.startup_timeout)
            except RuntimeError as e:
                print(f"serve_load: {e}", file=sys.stderr)
                return 1
            server_note = f"spawned: `{args.spawn}`, log {log_path}"
        if url is None:
            url = urllib.parse.urlparse("http://127.0.0.1:8080")
        barrier = threading.Barrier(args.clients + 1)
        clock = {}
        threads = [threading.Thread(target=client, args=(i, args, url, stats, clock, barrier), daemon=True)
                   for i in range(args.clients)]
        for t in threads:
            t.start()
        clock["start"] = start = time.perf_counter()
        clock["deadline"] = start + args.duration
        barrier.wait()
        print(f"serve_load: {args.clients} clients for {args.duration:g} s against "
              f"{urllib.parse.urlunparse(url)}", file=sys.stderr, flush=True)
        try:
            for t in threads:
                t.join()
        except KeyboardInterrupt:
            stats.error(start, "interrupted (SIGINT or SIGTERM) before the clients finished")
        wall = time.perf_counter() - start
        batching, server_ttft = server_metrics(url)
        stats.after_run = wait_until_idle(url, args.settle_timeout)
        if stats.after_run is not None and (stats.after_run[0] or stats.after_run[1]):
            stats.error(start, f"{stats.after_run[0]} requests still running and {stats.after_run[1]} KV blocks "
                               f"held {args.settle_timeout:g} s after the run")
    finally:
        if server is not None:
            code = server.stop()
            if code not in (0, None) and url is not None:
                stats.error(start, f"the spawned server exited with {code}: {server.log_text()[-500:]!r}")

    text, summary = report(args, url, stats, wall, batching, server_ttft, server_note)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
    if stats.errors:
        return 1
    if stats.completed < args.min_completed:
        print(f"serve_load: {stats.completed} requests completed, fewer than {args.min_completed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
