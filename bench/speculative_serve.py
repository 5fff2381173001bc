#!/usr/bin/env python3
"""Speculative decoding through the server (`fitllm serve --lookup`, or `-md` with --md), measured
(issue 23): bench/speculative.py's edit / summarise / code-refactor prompts, greedy, sent to one
server started without --lookup and one started with it (the same settings otherwise, -np 1),
one request at a time, one server at a time, --reps rounds of both. With --md, the drafter is a
draft model instead, as bench/speculative_draft.py runs it: the target is the demo model in F16
(made under .cache/ when missing), the draft the demo model itself (Q4_K_M), --draft-p-min as given. The texts must be identical (exit
status 1 otherwise). A request's decode speed is its streamed tokens after the first over the time
from the first streamed token to the last (prompt excluded), as `run`'s summary line counts it;
the drafted and accepted totals come from /metrics.

  .venv/bin/python bench/speculative_serve.py [--fitllm build/fitllm] [-n 256] [-t 2] [--reps 2]
                                              [--draft-max 10] [--md [--draft-p-min P] [--draft-vocab N]]
                                              [--parallel N] [--json out.json]
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from speculative import MODEL, PROMPTS, chat_prompt  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LISTENING = re.compile(r"listening on http://[^:]+:(\d+)")


class Server:
    def __init__(self, args: argparse.Namespace, lookup: bool):
        # lookup: the server that drafts (by prompt lookup, or with args.draft_model).
        cmd = [args.fitllm, "serve", "-m", args.model, "--port", "0", "-t", str(args.threads), "-np", str(args.parallel),
               "-c", "2048"]
        if lookup and args.md:
            cmd += ["-md", args.draft_model, "--draft-max", str(args.draft_max), "--draft-p-min", str(args.draft_p_min),
                    "--draft-vocab", str(args.draft_vocab)]
        elif lookup:
            cmd += ["--lookup", "--draft-max", str(args.draft_max)]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        self.port = None
        lines = []
        deadline = time.time() + 120
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            m = LISTENING.search(line)
            if m:
                self.port = int(m.group(1))
            if "ready" in line:
                break
        if self.port is None or self.proc.poll() is not None:
            self.proc.kill()
            sys.exit("speculative_serve.py: the server did not start:\n" + "".join(lines))

    def post(self, path: str, body: dict) -> http.client.HTTPResponse:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        return conn.getresponse()

    def metric(self, name: str) -> float:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def complete(self, prompt: str, n: int) -> dict:
        body = {"prompt": chat_prompt(prompt), "max_tokens": n, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}
        r = self.post("/v1/completions", body)
        if r.status != 200:
            sys.exit(f"speculative_serve.py: HTTP {r.status}: {r.read().decode()}")
        text, times, usage = "", [], None
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                usage = ev["usage"]
            for ch in ev.get("choices", []):
                if ch.get("text"):
                    text += ch["text"]
                    times.append(time.perf_counter())
        n_gen = usage["completion_tokens"] if usage else 0
        span = times[-1] - times[0] if len(times) > 1 else 0.0
        # Tokens after the first over the time after the first (pieces may carry several tokens).
        return {"text": text, "n_gen": n_gen, "n_prompt": usage["prompt_tokens"] if usage else 0,
                "tok_s": (n_gen - 1) / span if span > 0 else 0.0}

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fitllm", default=os.path.join(ROOT, "build", "fitllm"))
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("-n", type=int, default=256, help="tokens to generate at most per prompt")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2, help="requests of each prompt per server (alternating)")
    ap.add_argument("--draft-max", type=int, help="default 10 (--lookup), 8 (--md)")
    ap.add_argument("--md", action="store_true", help="draft with a draft model (-md) instead of --lookup")
    ap.add_argument("--draft-model", help="with --md: the draft (default: the demo model, Q4_K_M)")
    ap.add_argument("--draft-p-min", type=float, default=0.75, help="with --md (default 0.75)")
    ap.add_argument("--draft-vocab", type=int, default=0, help="with --md: the draft scores the first N tokens only")
    ap.add_argument("--parallel", type=int, default=1,
                    help="-np N, and N requests in flight at once; adds the throughput of all (tokens over wall time)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    if args.draft_max is None:
        args.draft_max = 8 if args.md else 10
    if args.md:
        from speculative_draft import DEMO, F16, make_f16  # noqa: E402
        args.draft_model = args.draft_model or DEMO
        if args.model == MODEL:  # the target: the demo model in F16
            if not os.path.exists(F16):
                os.makedirs(os.path.dirname(F16), exist_ok=True)
                make_f16(DEMO, F16)
            args.model = F16
        print(f"target {os.path.relpath(args.model, ROOT)}, draft {os.path.relpath(args.draft_model, ROOT)}",
              file=sys.stderr)

    # One server at a time (an idle one would still hold its threads): each round runs every
    # prompt on a server without --lookup, then on one with it.
    results = {name: ([], []) for name in PROMPTS}
    drafted = accepted = 0.0
    wall = [[], []]  # with --parallel: each round's seconds for all prompts, without and with drafts
    for _ in range(args.reps):
        for lookup in (False, True):
            srv = Server(args, lookup)
            try:
                if args.parallel > 1:
                    from concurrent.futures import ThreadPoolExecutor
                    start = time.perf_counter()
                    with ThreadPoolExecutor(max_workers=args.parallel) as pool:
                        futures = {name: pool.submit(srv.complete, prompt, args.n) for name, prompt in PROMPTS.items()}
                    wall[1 if lookup else 0].append(time.perf_counter() - start)
                    for name, f in futures.items():
                        results[name][1 if lookup else 0].append(f.result())
                else:
                    for name, prompt in PROMPTS.items():
                        results[name][1 if lookup else 0].append(srv.complete(prompt, args.n))
                if lookup:
                    drafted += srv.metric("fitllm_spec_drafted_total")
                    accepted += srv.metric("fitllm_spec_accepted_total")
            finally:
                srv.stop()
    rows, same = [], True
    spec_name = "-md tok/s" if args.md else "lookup tok/s"
    print(f"{'prompt':18} {'p tok':>6} {'gen':>5} {'plain tok/s':>12} {spec_name:>13} {'ratio':>6}")
    for name, (plain, spec) in results.items():
        identical = len({r["text"] for r in plain + spec}) == 1
        same &= identical
        best_plain = max(r["tok_s"] for r in plain)
        best_spec = max(r["tok_s"] for r in spec)
        row = {"prompt": name, "n_prompt": spec[0]["n_prompt"], "n_gen": spec[0]["n_gen"],
               "plain_tok_s": best_plain, "lookup_tok_s": best_spec, "ratio": best_spec / best_plain,
               "identical": identical}
        rows.append(row)
        print(f"{name:18} {row['n_prompt']:6d} {row['n_gen']:5d} {best_plain:12.1f} {best_spec:13.1f} "
              f"{row['ratio']:5.2f}x" + ("" if identical else "  texts DIFFER"))
    gen = sum(r["n_gen"] for r in rows)
    t_plain = sum(r["n_gen"] / r["plain_tok_s"] for r in rows)
    t_spec = sum(r["n_gen"] / r["lookup_tok_s"] for r in rows)
    print(f"{'all':18} {'':6} {gen:5d} {gen / t_plain:12.1f} {gen / t_spec:13.1f} {t_plain / t_spec:5.2f}x   "
          f"texts {'identical' if same else 'DIFFER'}; drafted {drafted:.0f}, accepted {accepted:.0f}")
    throughput = None
    if args.parallel > 1:
        # All prompts' tokens over the wall time of the round (prompts included), the best round.
        throughput = [gen / min(w) for w in wall]
        print(f"-np {args.parallel}, {args.parallel} requests in flight: {throughput[0]:.1f} tok/s without, "
              f"{throughput[1]:.1f} tok/s with drafts ({throughput[1] / throughput[0]:.2f}x), prompts included")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"drafter": "draft model" if args.md else "lookup", "rows": rows, "ratio": t_plain / t_spec,
                       "identical": same, "drafted": drafted, "accepted": accepted, "parallel": args.parallel,
                       "throughput_tok_s": throughput}, f, indent=1)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
