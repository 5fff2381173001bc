#!/usr/bin/env python3
"""A bounded load test of `fitllm serve` and llama.cpp's `llama-server` on the same model with the
same slots (issue 7, "Proof"): for each number of concurrent clients, every client sends a few
streamed chat requests one after another (mixed prompt lengths; some clients hang up mid-stream),
then a table per server: requests ok / failed / lost / hung up, aggregate generation tokens/s,
per-request latency and time to first token (p50 / p90 / p99), the server's peak RSS, and the
fitllm / llama-server ratios.

  .venv/bin/python bench/server_load.py                          # both servers, 1, 16 and 32 clients
  .venv/bin/python bench/server_load.py --servers fitllm,llama-server-passive --clients 16 --rounds 2   # A B, B A
  .venv/bin/python bench/server_load.py --servers fitllm --clients 16,32 --requests 3
  .venv/bin/python bench/server_load.py -m MODEL.gguf -np 4 -c 4096 -t 2 --max-tokens 64 --json out.json
  .venv/bin/python bench/server_load.py --url fitllm=http://127.0.0.1:8080   # a server already running (no RSS)

Default model: models/bench/llama-156m-q8_0.gguf (tools/gen_bench_models.py --shape 156m; random
weights, so the text means nothing but the cost per token is a real 156M model's).
llama-server: built by tools/build_llama_server.sh into .cache/llama-server/bin/llama-server from
the llama-cpp-python source package pinned in requirements-oracle.txt.

What counts: a request is "ok" when its stream ends with `data: [DONE]` after an HTTP 200;
"failed" when the server answers an error (a non-200 status or an error event); "lost" when the
connection breaks, the stream ends without [DONE], or nothing arrives for --timeout seconds. Every
--hangup-every'th request is one whose client closes the connection after its 4th content chunk
("hung up"; these are meant to free their slot at once; they count neither as ok nor as lost).
Generated tokens per request: usage.completion_tokens when the server sends usage
(stream_options.include_usage), else the number of content chunks. Aggregate tok/s = all generated
tokens (hung-up requests' chunks included) / the level's wall time. Latency and TTFT percentiles
are over ok requests. Peak RSS: VmHWM of the server process (/proc/PID/status) after the level,
so it is the peak since the server started. "In use / budget": the most fitllm's GET /v1/memory
showed in use on its device during the level (sampled twice a second) and the budget. The 1-minute load average is printed with each row:
the machine is shared, so compare the servers in the same run. llama-server's OpenMP threads spin
at barriers, which on a machine busier than its cores slows it down many times over;
"llama-server-passive" is the same binary with OMP_WAIT_POLICY=passive (its threads sleep instead).
Exit status 1 when any request failed or was lost.
"""
from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import random
import shlex
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MODEL = os.path.join(ROOT, "models", "bench", "llama-156m-q8_0.gguf")
DEFAULT_FITLLM = os.path.join(ROOT, "build", "fitllm")
DEFAULT_LLAMA_SERVER = os.path.join(ROOT, ".cache", "llama-server", "bin", "llama-server")
LLAMA_SERVERS = ("llama-server", "llama-server-passive")  # the second: OMP_WAIT_POLICY=passive
HANGUP_AFTER_CHUNKS = 4

# Plain words for prompts; the model's weights are random, only the prompt lengths matter.
WORDS = ("the a of and to in is was he for it with as his on be at by had are but from or have an they which "
         "one you were her all she there would their we him been has when who will more no if out so said what "
         "up its about into than them can only other new some could time these two may then do first any my "
         "now such like our over man me even most made after also did many before must through back years "
         "where much your way well down should because each just those people how too little state good very "
         "make world still own see men work long get here between both life being under never day same another "
         "know while last might us great old year off come since against go came right used take three").split()
# Prompt lengths in words (roughly 1.3 tokens each), drawn per request: short, medium and long.
PROMPT_WORDS = (8, 40, 160, 320)


@dataclass
class Result:
    ok: bool = False
    failed: str = ""     # the server's error
    lost: str = ""       # what broke
    hung_up: bool = False
    tokens: int = 0
    usage_tokens: bool = False
    latency_s: float = 0.0
    ttft_s: float | None = None


@dataclass
class Level:
    server: str
    clients: int
    round: int = 1
    requests: int = 0
    ok: int = 0
    failed: int = 0
    lost: int = 0
    hung_up: int = 0
    tokens: int = 0
    wall_s: float = 0.0
    tok_s: float = 0.0
    latency: list = field(default_factory=list)  # p50, p90, p99
    ttft: list = field(default_factory=list)
    peak_rss_mib: float | None = None
    budget_used_mib: float | None = None  # the most /v1/memory showed in use on a device (fitllm)
    budget_mib: float | None = None       # that device's capacity: the budget
    loadavg: float = 0.0
    token_source: str = ""
    errors: list = field(default_factory=list)  # up to 5 distinct failure messages


def percentiles(values, ps=(50, 90, 99)):
    """Nearest-rank percentiles; None when there are no values."""
    if not values:
        return [None for _ in ps]
    ordered = sorted(values)
    return [ordered[min(len(ordered) - 1, max(0, math.ceil(p / 100 * len(ordered)) - 1))] for p in ps]


def make_prompt(rng):
    n = rng.choice(PROMPT_WORDS)
    words = " ".join(rng.choice(WORDS) for _ in range(n))
    return f"Continue this text: {words}"


def one_request(host, port, model, prompt, args, hang_up, timeout):
    """Sends one streamed chat completion and reads it to the end (or hangs up)."""
    result = Result(hung_up=hang_up)
    body = json.dumps({
        "model": model, "messages": [{"role": "user", "content": prompt}], "stream": True,
        "stream_options": {"include_usage": True}, "max_tokens": args.max_tokens,
        "temperature": args.temperature, "seed": random.randrange(1 << 30)})
    start = time.perf_counter()
    connection = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        connection.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            text = response.read().decode(errors="replace")
            try:
                text = json.loads(text)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                pass
            result.failed = f"HTTP {response.status}: {text[:200]}"
            return result
        chunks = 0
        done = False
        for raw in response:  # one line at a time
            line = raw.decode(errors="replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                break
            event = json.loads(data)
            if "error" in event:
                result.failed = f"error event: {json.dumps(event['error'])[:200]}"
                return result
            if event.get("usage"):
                result.tokens = event["usage"].get("completion_tokens", result.tokens)
                result.usage_tokens = True
            choices = event.get("choices") or []
            if choices and (choices[0].get("delta") or {}).get("content"):
                chunks += 1
                if result.ttft_s is None:
                    result.ttft_s = time.perf_counter() - start
                if hang_up and chunks >= HANGUP_AFTER_CHUNKS:
                    result.tokens = chunks
                    return result
        if not result.usage_tokens:
            result.tokens = chunks
        if hang_up:
            return result  # it finished before the client hung up
        if not done:
            result.lost = "the stream ended without data: [DONE]"
            return result
        result.ok = True
        result.latency_s = time.perf_counter() - start
        return result
    except (OSError, http.client.HTTPException, ValueError) as e:
        result.lost = f"{type(e).__name__}: {e}"[:200]
        return result
    finally:
        connection.close()  # for a hang-up, this is the disconnect


def peak_rss_mib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def http_ok(url, timeout=2):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status == 200
    except (OSError, urllib.error.HTTPError):
        return False


def host_port(url):
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    return host, int(port)


def run_level(name, url, model, pid, clients, args, seed):
    host, port = host_port(url)
    n_requests = clients * args.requests
    results = [None] * n_requests
    rng = random.Random(seed)
    plan = [(make_prompt(rng), args.hangup_every > 0 and (i + 1) % args.hangup_every == 0) for i in range(n_requests)]

    def client(c):
        for r in range(args.requests):
            i = c * args.requests + r
            prompt, hang_up = plan[i]
            results[i] = one_request(host, port, model, prompt, args, hang_up, args.timeout)

    loadavg = os.getloadavg()[0]
    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(clients)]
    memory = {"used": None, "capacity": None}
    running = threading.Event()
    running.set()

    def sample_memory():
        """fitllm's GET /v1/memory twice a second: the most in use against the budget."""
        while running.is_set():
            try:
                with urllib.request.urlopen(url + "/v1/memory", timeout=5) as r:
                    for d in json.load(r).get("devices", []):
                        if memory["used"] is None or d["used"] > memory["used"]:
                            memory["used"], memory["capacity"] = d["used"], d.get("capacity")
            except (OSError, ValueError, KeyError):
                pass  # a sample lost under load; the next one counts
            time.sleep(0.5)

    sampler = threading.Thread(target=sample_memory, daemon=True) if name == "fitllm" else None
    start = time.perf_counter()
    if sampler:
        sampler.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    running.clear()
    if sampler:
        sampler.join()
    level = Level(server=name, clients=clients, requests=n_requests, wall_s=wall, loadavg=loadavg)
    if memory["used"] is not None:
        level.budget_used_mib = memory["used"] / 2**20
        level.budget_mib = memory["capacity"] / 2**20 if memory["capacity"] else None
    for r in results:
        level.ok += r.ok
        level.failed += bool(r.failed)
        level.lost += bool(r.lost)
        level.hung_up += r.hung_up and not r.failed and not r.lost
        level.tokens += r.tokens
        message = r.failed or r.lost
        if message and message not in level.errors and len(level.errors) < 5:
            level.errors.append(message)
    level.tok_s = level.tokens / wall if wall > 0 else 0.0
    level.latency = percentiles([r.latency_s for r in results if r.ok])
    level.ttft = percentiles([r.ttft_s for r in results if r.ok and r.ttft_s is not None])
    used_usage = sum(r.usage_tokens for r in results if r.ok)
    level.token_source = "usage" if used_usage == level.ok and level.ok else ("chunks" if not used_usage else "mixed")
    level.peak_rss_mib = peak_rss_mib(pid) if pid else None
    if not http_ok(url + "/health"):
        level.errors.append("GET /health does not answer 200 after the level")
        level.lost += 1
    return level


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(name, args, log_dir):
    port = free_port()
    common = ["-m", args.model, "--host", "127.0.0.1", "--port", str(port), "-np", str(args.np),
              "-c", str(args.ctx), "-t", str(args.threads)]
    env = dict(os.environ)
    if name == "fitllm":
        command = [args.fitllm, "serve", *common, *shlex.split(args.fitllm_args)]
    else:
        command = [args.llama_server, *common, *shlex.split(args.llama_server_args)]
        if name == "llama-server-passive":
            env["OMP_WAIT_POLICY"] = "passive"
    for path in (command[0], args.model):
        if not os.path.exists(path):
            sys.exit(f"server_load.py: {path} not found"
                     + (" (tools/build_llama_server.sh builds it)" if path == args.llama_server else ""))
    log_path = os.path.join(log_dir, f"{name}.log")
    log = open(log_path, "wb")
    prefix = "OMP_WAIT_POLICY=passive " if name == "llama-server-passive" else ""
    print(f"# {name}: {prefix}{shlex.join(command)}  (log: {log_path})", flush=True)
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while not http_ok(url + "/health"):
        if process.poll() is not None:
            sys.exit(f"server_load.py: {name} exited with {process.returncode}; see {log_path}")
        if time.monotonic() > deadline:
            process.kill()
            sys.exit(f"server_load.py: {name} did not answer GET /health within 300 s; see {log_path}")
        time.sleep(0.2)
    return process, log, url


def stop_server(process, log):
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    log.close()


def model_id(url):
    with urllib.request.urlopen(url + "/v1/models", timeout=10) as r:
        data = json.load(r).get("data") or []
    return data[0]["id"] if data else "default"


def fmt(values, digits=2):
    return "/".join("-" if v is None else f"{v:.{digits}f}" for v in values)


def print_table(levels):
    header = ("| server | round | clients | ok | failed | lost | hung up | gen tokens | wall s | gen tok/s "
              "| latency p50/p90/p99 s | TTFT p50/p90/p99 s | peak RSS MiB | in use / budget MiB | load |")
    print("\n" + header)
    print("|" + "---|" * (header.count("|") - 1))
    for lv in levels:
        rss = "-" if lv.peak_rss_mib is None else f"{lv.peak_rss_mib:.0f}"
        budget = "-" if lv.budget_used_mib is None else f"{lv.budget_used_mib:.0f} / {lv.budget_mib or 0:.0f}"
        print(f"| {lv.server} | {lv.round} | {lv.clients} | {lv.ok} | {lv.failed} | {lv.lost} | {lv.hung_up} | {lv.tokens} "
              f"({lv.token_source}) | {lv.wall_s:.1f} | {lv.tok_s:.1f} | {fmt(lv.latency)} | {fmt(lv.ttft)} "
              f"| {rss} | {budget} | {lv.loadavg:.1f} |")
    # Over all rounds: tok/s = all tokens / all wall time; latency, TTFT, RSS: the rounds' medians.
    by_key = {}
    for key in dict.fromkeys((lv.server, lv.clients) for lv in levels):
        rows = [lv for lv in levels if (lv.server, lv.clients) == key]

        def median(values):
            values = sorted(v for v in values if v is not None)
            return values[len(values) // 2] if values else None

        by_key[key] = Level(server=key[0], clients=key[1], tokens=sum(lv.tokens for lv in rows),
                            wall_s=sum(lv.wall_s for lv in rows),
                            tok_s=sum(lv.tokens for lv in rows) / max(sum(lv.wall_s for lv in rows), 1e-9),
                            latency=[median(lv.latency[0] for lv in rows)], ttft=[median(lv.ttft[0] for lv in rows)],
                            peak_rss_mib=median(lv.peak_rss_mib for lv in rows))

    def ratio(a, b):
        return "-" if a is None or not b else f"{a / b:.2f}x"

    ratios = []
    for lv in by_key.values():
        for baseline in LLAMA_SERVERS:
            other = by_key.get((baseline, lv.clients))
            if lv.server == "fitllm" and other:
                ratios.append(f"| {baseline} | {lv.clients} | {ratio(lv.tok_s, other.tok_s)} "
                              f"| {ratio(lv.latency[0], other.latency[0])} | {ratio(lv.ttft[0], other.ttft[0])} "
                              f"| {ratio(lv.peak_rss_mib, other.peak_rss_mib)} |")
    if ratios:
        print("\nfitllm / llama-server:\n\n| baseline | clients | gen tok/s | latency p50 | TTFT p50 | peak RSS |\n"
              "|---|---|---|---|---|---|")
        print("\n".join(ratios))
    for lv in levels:
        for e in lv.errors:
            print(f"{lv.server} x{lv.clients}: {e}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-m", "--model", default=DEFAULT_MODEL)
    parser.add_argument("--servers", default="fitllm,llama-server",
                        help="comma-separated: fitllm, llama-server, llama-server-passive")
    parser.add_argument("--url", action="append", default=[], metavar="NAME=URL",
                        help="use a server already running at URL for NAME instead of starting one")
    parser.add_argument("--clients", default="1,16,32", help="comma-separated numbers of concurrent clients")
    parser.add_argument("--requests", type=int, default=2, help="requests per client, one after another")
    parser.add_argument("-np", "--np", type=int, default=4, help="slots (both servers)")
    parser.add_argument("-c", "--ctx", type=int, default=4096, help="context cells in all (both servers)")
    parser.add_argument("-t", "--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--hangup-every", type=int, default=8, help="every Nth request hangs up mid-stream (0: none)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds without data before a request is lost")
    parser.add_argument("--fitllm", default=DEFAULT_FITLLM)
    parser.add_argument("--llama-server", default=DEFAULT_LLAMA_SERVER)
    parser.add_argument("--fitllm-args", default="", help="extra arguments for fitllm serve")
    parser.add_argument("--llama-server-args", default="", help="extra arguments for llama-server")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run the servers this many times, alternating their order; ratios over the totals")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", help="write the rows here too")
    args = parser.parse_args()

    servers = [s for s in args.servers.split(",") if s]
    for s in servers:
        if s not in ("fitllm", *LLAMA_SERVERS):
            sys.exit(f"server_load.py: --servers: unknown server '{s}' (fitllm, {', '.join(LLAMA_SERVERS)})")
    urls = dict(u.split("=", 1) for u in args.url)
    client_counts = [int(c) for c in args.clients.split(",")]
    log_dir = tempfile.mkdtemp(prefix="server-load-")
    print(f"# model {args.model}, -np {args.np}, -c {args.ctx}, -t {args.threads}, max_tokens {args.max_tokens}, "
          f"{args.requests} requests per client, 1 in {args.hangup_every} hangs up; "
          f"{os.cpu_count()} CPUs, load {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    levels = []
    # Rounds alternate the order (A B, B A, ...) so that a load that drifts hits both alike.
    order = [name for r in range(args.rounds) for name in (servers if r % 2 == 0 else servers[::-1])]
    for name in order:
        process = log = None
        if name in urls:
            url, pid = urls[name].rstrip("/"), None
        else:
            process, log, url = start_server(name, args, log_dir)
            pid = process.pid
        try:
            model = model_id(url)
            warm = one_request(*host_port(url), model, "Hello", args, False, args.timeout)
            if not warm.ok:
                print(f"# {name}: the warm-up request did not succeed: {warm.failed or warm.lost}", flush=True)
            for i, clients in enumerate(client_counts):
                level = run_level(name, url, model, pid, clients, args, args.seed + i)
                level.round = 1 + sum(lv.server == name and lv.clients == clients for lv in levels)
                levels.append(level)
                print(f"# {name} x{clients}: {level.ok}/{level.requests} ok, {level.tok_s:.1f} gen tok/s, "
                      f"{level.wall_s:.1f} s, load {level.loadavg:.1f}", flush=True)
        finally:
            if process:
                stop_server(process, log)
    print_table(levels)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(lv) for lv in levels], f, indent=1)
    sys.exit(1 if any(lv.failed or lv.lost for lv in levels) else 0)


if __name__ == "__main__":
    main()
