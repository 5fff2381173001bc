#!/usr/bin/env python3
"""Multi-turn chat against `fitllm serve` and llama.cpp's `llama-server` (issue 22, "Prompt cache
across requests"): conversations of several turns whose history grows (each turn sends every
earlier message and the server's own earlier answers, as a chat client does), a few conversations
at once. Per turn: time to first token (streamed), the prompt tokens and how many the server took
from its cache (usage.prompt_tokens_details.cached_tokens; llama-server's timings.cache_n), and the
total time of the workload.

  .venv/bin/python bench/prompt_cache.py                                     # fitllm, fitllm without cache, llama-server
  .venv/bin/python bench/prompt_cache.py -m MODEL.gguf --conversations 10 --turns 10 --clients 4 --rounds 2

Servers: "fitllm" (its prompt cache on, the default), "fitllm-nocache" (--cache-prompts 0: every
turn computes its whole prompt; its TTFT per prompt token is the prefill rate the others are
compared with), "llama-server" and "llama-server-passive" (OMP_WAIT_POLICY=passive), built by
tools/build_llama_server.sh. Both servers run with the same -np, -c, -t. Greedy answers of at most
--max-tokens tokens. --clients conversations run at once, each client taking the next conversation
when its own is done.

Reported per server and turn: median TTFT; median prompt tokens and cached tokens; and "TTFT / new
tokens' prefill" = TTFT divided by the time fitllm-nocache takes to answer a cold prompt of as many
tokens as the turn did not take from the cache (the new tokens' prefill: measured after its
conversations, prompts of 8 to 1024 token ids sent to /v1/completions with max_tokens 1, 3 times
each, the median, interpolated): 1.0 means a turn costs only its new tokens. The issue's target:
that ratio <= 1.2 and fitllm's TTFT <= llama-server's at every turn. The 1-minute load average is
printed: the machine may be shared, so compare servers in the same run (--rounds alternates order).
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from server_load import (DEFAULT_FITLLM, DEFAULT_LLAMA_SERVER, ROOT, host_port, model_id,  # noqa: E402
                         start_server, stop_server)

DEFAULT_MODEL = os.path.join(ROOT, "models", "gemma-3-270m-q4_k_m.gguf")
SERVERS = ("fitllm", "fitllm-nocache", "llama-server", "llama-server-passive")

TOPICS = ("the history of the printing press", "how bread rises", "why the sky is blue", "the rules of chess",
          "how a bicycle stays upright", "the water cycle", "what makes a good story", "how bees find flowers",
          "the life of a star", "how to plan a small garden", "why cats purr", "the invention of the telephone")
FOLLOW_UPS = ("Can you say more about that?", "Give me one concrete example.", "What is the most surprising part?",
              "How would you explain it to a child?", "What do people often get wrong about it?",
              "Summarise what we said so far in two sentences.", "What should I read next about it?",
              "Is there a simple experiment that shows it?", "How has our understanding changed over time?",
              "What question should I ask next?")


@dataclass
class Turn:
    server: str
    conversation: int
    turn: int
    ttft_s: float
    total_s: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int


def user_message(conversation, turn):
    topic = TOPICS[conversation % len(TOPICS)]
    if turn == 0:
        return f"I would like to learn about {topic}. Please explain the main ideas briefly."
    return FOLLOW_UPS[(turn - 1 + conversation) % len(FOLLOW_UPS)]


def chat_turn(url, model, messages, max_tokens, timeout):
    """One streamed greedy chat completion: (answer text, ttft, total seconds, usage dict, cache_n)."""
    host, port = host_port(url)
    body = json.dumps({"model": model, "messages": messages, "stream": True, "max_tokens": max_tokens,
                       "temperature": 0.0, "stream_options": {"include_usage": True}})
    start = time.perf_counter()
    connection = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        connection.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {response.read()[:300]!r}")
        text, ttft, usage, cache_n = "", None, {}, None
        for raw in response:
            line = raw.decode("utf-8", errors="replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            event = json.loads(data)
            if "error" in event:
                raise RuntimeError(str(event["error"]))
            for choice in event.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content") or ""
                if piece and ttft is None:
                    ttft = time.perf_counter() - start
                text += piece
            if event.get("usage"):
                usage = event["usage"]
            if event.get("timings"):
                cache_n = event["timings"].get("cache_n", cache_n)
        total = time.perf_counter() - start
        return text, ttft if ttft is not None else total, total, usage, cache_n
    finally:
        connection.close()


PREFILL_LENGTHS = (8, 16, 32, 64, 128, 256, 512, 1024)


def prefill_curve(url, model, args):
    """{tokens: median seconds to the first token of a cold prompt of that many token ids}."""
    host, port = host_port(url)
    curve = {}
    for n in PREFILL_LENGTHS:
        times = []
        for rep in range(3):
            # Distinct ids each time (no prefix shared with an earlier prompt); ids 1000+ are ordinary
            # tokens in every vocabulary this is run with.
            ids = [1000 + (rep * 7919 + n * 31 + i * 13) % 20000 for i in range(n)]
            body = json.dumps({"model": model, "prompt": ids, "max_tokens": 1, "temperature": 0.0, "stream": True})
            start = time.perf_counter()
            connection = http.client.HTTPConnection(host, port, timeout=args.timeout)
            try:
                connection.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
                response = connection.getresponse()
                if response.status != 200:
                    raise RuntimeError(f"HTTP {response.status}: {response.read()[:300]!r}")
                first = None  # the first event with text or an end (a server may send an empty one first)
                for raw in response:
                    line = raw.decode("utf-8", errors="replace").strip()
                    if first is not None or not line.startswith("data:") or line == "data: [DONE]":
                        continue
                    choices = json.loads(line[5:]).get("choices") or [{}]
                    if choices[0].get("text") or choices[0].get("finish_reason"):
                        first = time.perf_counter() - start
                times.append(first if first is not None else time.perf_counter() - start)
            finally:
                connection.close()
        curve[n] = statistics.median(times)
    return curve


def prefill_seconds(curve, n):
    """The curve at n tokens, linear between its points (and beyond its ends)."""
    points = sorted(curve.items())
    for (n0, t0), (n1, t1) in zip(points, points[1:]):
        if n <= n1 or (n1, t1) == points[-1]:
            return t0 + (t1 - t0) * (n - n0) / (n1 - n0)
    return points[0][1]


def run_server(name, url, model, args):
    """Every conversation, --clients at a time; returns the turns."""
    turns, lock, next_conversation = [], threading.Lock(), [0]
    errors = []

    def client():
        while True:
            with lock:
                c = next_conversation[0]
                next_conversation[0] += 1
            if c >= args.conversations:
                return
            messages = [{"role": "system", "content": "You are a patient teacher. Answer in a few sentences."}]
            for t in range(args.turns):
                messages.append({"role": "user", "content": user_message(c, t)})
                try:
                    text, ttft, total, usage, cache_n = chat_turn(url, model, messages, args.max_tokens, args.timeout)
                except Exception as e:  # noqa: BLE001 - reported, the run goes on
                    errors.append(f"conversation {c} turn {t}: {e}")
                    return
                cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
                if cached is None:
                    cached = cache_n or 0
                with lock:
                    turns.append(Turn(name, c, t, ttft, total, usage.get("prompt_tokens", 0), cached,
                                      usage.get("completion_tokens", 0)))
                messages.append({"role": "assistant", "content": text})

    threads = [threading.Thread(target=client) for _ in range(args.clients)]
    start = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - start
    return turns, wall, errors


def median(values):
    return statistics.median(values) if values else float("nan")


def print_tables(all_turns, walls, n_turns, curve):
    servers = list(dict.fromkeys(t.server for t in all_turns))
    if curve:
        print("\nfitllm-nocache, a cold prompt's TTFT: " +
              ", ".join(f"{n} tokens {s * 1e3:.0f} ms" for n, s in sorted(curve.items())))
    print("\n| server | turn | TTFT p50 (ms) | prompt tokens | cached | TTFT / new tokens' prefill |")
    print("|---|---|---|---|---|---|")
    for s in servers:
        for t in range(n_turns):
            rows = [x for x in all_turns if x.server == s and x.turn == t]
            if not rows:
                continue
            ttft = median([x.ttft_s for x in rows])
            ratio = ""
            if curve:
                new = median([prefill_seconds(curve, max(x.prompt_tokens - x.cached_tokens, 1)) for x in rows])
                ratio = f"{ttft / new:.2f}"
            print(f"| {s} | {t + 1} | {ttft * 1e3:.0f} | {median([x.prompt_tokens for x in rows]):.0f} | "
                  f"{median([x.cached_tokens for x in rows]):.0f} | {ratio} |")
    print("\n| server | turns | total s | TTFT p50 all turns (ms) | cached / prompt tokens |")
    print("|---|---|---|---|---|")
    for s in servers:
        rows = [x for x in all_turns if x.server == s]
        prompt = sum(x.prompt_tokens for x in rows)
        cached = sum(x.cached_tokens for x in rows)
        print(f"| {s} | {len(rows)} | {sum(walls[s]):.1f} | {median([x.ttft_s for x in rows]) * 1e3:.0f} | "
              f"{cached}/{prompt} |")
    if "fitllm" in servers:
        for other in [s for s in servers if s.startswith("llama-server")]:
            worse = []
            for t in range(n_turns):
                a = [x.ttft_s for x in all_turns if x.server == "fitllm" and x.turn == t]
                b = [x.ttft_s for x in all_turns if x.server == other and x.turn == t]
                if a and b and median(a) > median(b):
                    worse.append(t + 1)
            print(f"\nfitllm / {other}: total time {sum(walls['fitllm']) / sum(walls[other]):.2f}x; "
                  f"TTFT p50 {median([x.ttft_s for x in all_turns if x.server == 'fitllm']) / median([x.ttft_s for x in all_turns if x.server == other]):.2f}x; "
                  f"turns where fitllm's TTFT p50 is higher: {worse or 'none'}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-m", "--model", default=DEFAULT_MODEL)
    parser.add_argument("--servers", default="fitllm,fitllm-nocache,llama-server", help=f"comma-separated: {SERVERS}")
    parser.add_argument("--conversations", type=int, default=10)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--clients", type=int, default=4, help="conversations at once")
    parser.add_argument("-np", "--np", type=int, default=4, help="slots (every server)")
    parser.add_argument("-c", "--ctx", type=int, default=8192, help="context cells in all (every server)")
    parser.add_argument("-t", "--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--fitllm", default=DEFAULT_FITLLM)
    parser.add_argument("--llama-server", default=DEFAULT_LLAMA_SERVER)
    parser.add_argument("--fitllm-args", default="")
    parser.add_argument("--llama-server-args", default="")
    parser.add_argument("--rounds", type=int, default=1, help="run the servers this many times, alternating order")
    parser.add_argument("--json", help="write every turn here too")
    args = parser.parse_args()
    servers = [s for s in args.servers.split(",") if s]
    for s in servers:
        if s not in SERVERS:
            sys.exit(f"prompt_cache.py: --servers: unknown server '{s}' ({', '.join(SERVERS)})")
    log_dir = tempfile.mkdtemp(prefix="prompt-cache-")
    print(f"# model {args.model}, -np {args.np}, -c {args.ctx}, -t {args.threads}, {args.conversations} "
          f"conversations x {args.turns} turns, {args.clients} at once, max_tokens {args.max_tokens}; "
          f"{os.cpu_count()} CPUs, load {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    all_turns, walls, failed, curve = [], {}, False, {}
    order = [s for r in range(args.rounds) for s in (servers if r % 2 == 0 else servers[::-1])]
    for name in order:
        kind = "fitllm" if name.startswith("fitllm") else name
        extra = args.fitllm_args + (" --cache-prompts 0" if name == "fitllm-nocache" else "")
        run_args = argparse.Namespace(**{**vars(args), "fitllm_args": extra})
        process, log, url = start_server(kind, run_args, log_dir)
        try:
            model = model_id(url)
            chat_turn(url, model, [{"role": "user", "content": "Hello"}], 4, args.timeout)  # warm up
            turns, wall, errors = run_server(name, url, model, args)
            if name == "fitllm-nocache":
                curve = prefill_curve(url, model, args)
        finally:
            stop_server(process, log)
        all_turns += turns
        walls.setdefault(name, []).append(wall)
        print(f"# {name}: {len(turns)} turns in {wall:.1f} s, load {os.getloadavg()[0]:.1f}"
              + (f"; {len(errors)} failed: {errors[:3]}" if errors else ""), flush=True)
        failed |= bool(errors)
    print_tables(all_turns, walls, args.turns, curve)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([t.__dict__ for t in all_turns], f, indent=1)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
