#!/usr/bin/env python3
"""`fitllm serve` at its edges, measured (issue 19): hostile large requests under a memory budget,
slow connections held open, and a soak of mixed clients. Loopback only; every loop is bounded.

  .venv/bin/python bench/server_edges.py large [--max-body 64M] [--rounds 3]   # the big ones, concurrently
  .venv/bin/python bench/server_edges.py slow [--connections 256] [--seconds 20]
  .venv/bin/python bench/server_edges.py soak [--seconds 600] [--clients 32]
  .venv/bin/python bench/server_edges.py all --json out.json                   # the three, short soak

The server runs the demo model (models/gemma-3-270m-q4_k_m.gguf) with the issue's flags
(-t 1 -np 1 -c 512 --max-queue 2 --mem 1G; the soak: -np 4 --max-queue 16) inside a child memory
cgroup (v1) capped at --mem, page cache included (bench/memcap.py); where no cgroup can be made it
runs uncapped and only its VmHWM is reported. Reported per run: every request's outcome (its HTTP
status, or `no answer`), /health's latency sampled every 100 ms throughout (max and p99), the
server's VmHWM, the cgroup's peak and OOM kills, and whether the server lived. A run fails (exit
status 1) when a request went unanswered, the server died, /health took over 1 s, or memory went
past the budget.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import re
import select
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import memcap  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "models", "gemma-3-270m-q4_k_m.gguf")


class Server:
    """fitllm serve on a free loopback port, in a capped cgroup when one can be made."""

    def __init__(self, fitllm: str, model: str, mem: str, args: list[str]):
        self.budget = memcap.parse_size(mem)
        self.cgroup = None
        try:
            self.cgroup = memcap.MemCgroup(self.budget)
            self.cgroup_note = f"cgroup v1 capped at {mem}"
        except memcap.CgroupUnavailable as e:
            self.cgroup_note = f"no cgroup ({e}): VmHWM only"
        cmd = [fitllm, "serve", "-m", model, "--port", "0", "--mem", mem, *args]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                                     preexec_fn=self.cgroup.add_self if self.cgroup else None)
        line = self.proc.stderr.readline()
        m = re.search(r"listening on http://[\d.]+:(\d+)", line)
        if not m:
            self.stop()
            raise RuntimeError("fitllm serve did not start: " + line)
        self.port = int(m.group(1))
        self.log = [line]
        threading.Thread(target=lambda: [self.log.append(x) for x in self.proc.stderr], daemon=True).start()
        deadline = time.time() + 120
        while True:
            try:
                if http_request(self.port, "GET", "/health", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline or self.proc.poll() is not None:
                self.stop()
                raise RuntimeError("not ready: " + "".join(self.log))
            time.sleep(0.1)

    def status_kib(self, key: str) -> int | None:
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                m = re.search(key + r":\s+(\d+)", f.read())
                return int(m.group(1)) if m else None
        except OSError:
            return None

    def finish(self) -> dict:
        """Stops the server; its memory numbers (the budget's peak charge as /v1/memory tells it)."""
        charged = {}
        try:
            dev = json.loads(http_request(self.port, "GET", "/v1/memory", timeout=10)[1])["devices"][0]
            charged = {"charged_peak_bytes": dev["peak"],
                       "requests_pool_peak_bytes": {p["name"]: p["peak"] for p in dev["pools"]}.get("requests")}
        except (OSError, ValueError, KeyError):
            pass
        hwm = self.status_kib("VmHWM")
        alive = self.proc.poll() is None
        self.stop()
        out = {"alive_at_end": alive, "exit": self.proc.returncode, "vm_hwm_bytes": hwm * 1024 if hwm else None,
               "budget_bytes": self.budget, "memory_note": self.cgroup_note, **charged}
        if self.cgroup:
            st = self.cgroup.stats()
            out.update({"cgroup_peak_bytes": st["peak_bytes"], "oom_kills": st["oom_kill"]})
            self.cgroup.remove()
            self.cgroup = None
        return out

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def http_request(port, method, path, body=None, headers=None, timeout=60):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def send_large(port, path, body: bytes, timeout=120, headers=b""):
    """POSTs a large body the way a careful client does: it stops sending when the answer comes
    early (a refusal before the body was read). Returns the status, or None for no answer."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" +
                  headers + b"Content-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n")
        s.setblocking(False)
        sent, got = 0, b""
        deadline = time.time() + timeout
        while time.time() < deadline:
            want_write = [s] if sent < len(body) else []
            r, w, _ = select.select([s], want_write, [], 1.0)
            if r:
                try:
                    chunk = s.recv(65536)
                except (ConnectionResetError, BlockingIOError):
                    chunk = b""
                if not chunk:
                    break
                got += chunk
                if b"\r\n\r\n" in got:
                    head, rest = got.split(b"\r\n\r\n", 1)
                    m = re.search(rb"Content-Length: (\d+)", head)
                    if m and len(rest) >= int(m.group(1)):
                        break
            elif w:
                try:
                    sent += s.send(body[sent:sent + (1 << 20)])
                except (BrokenPipeError, ConnectionResetError):
                    sent = len(body)  # the server stopped reading: its answer may be on the way
                except BlockingIOError:
                    pass
        m = re.match(rb"HTTP/1\.[01] (\d+)", got)
        return int(m.group(1)) if m else None
    except OSError:
        return None
    finally:
        s.close()


class HealthWatch:
    """GET /health every 100 ms on its own connection; latencies in seconds (inf: no answer in 5 s)."""

    def __init__(self, port):
        self.port, self.latencies, self.stop_flag = port, [], False
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop_flag:
            t = time.perf_counter()
            try:
                ok = http_request(self.port, "GET", "/health", timeout=5)[0] == 200
            except OSError:
                ok = False
            self.latencies.append(time.perf_counter() - t if ok else float("inf"))
            time.sleep(0.1)

    def finish(self) -> dict:
        self.stop_flag = True
        self.thread.join()
        lat = sorted(self.latencies)
        return {"health_samples": len(lat), "health_max_s": lat[-1] if lat else None,
                "health_p99_s": lat[int(0.99 * (len(lat) - 1))] if lat else None}


# --- hostile requests -------------------------------------------------------------------------
def hostile_large(mb: int) -> list[tuple[str, str, bytes]]:
    n = mb << 20
    return [
        ("prompt_text", "/v1/completions", json.dumps({"prompt": "a" * n}).encode()),
        ("nested_json", "/v1/chat/completions", b"[" * n),
        ("wide_json", "/v1/completions", b'{"prompt": [' + b"1," * (n // 2 - 8) + b"1]}"),
        ("tokenize_big", "/tokenize", json.dumps({"content": "ab " * (n // 3)}).encode()),
        ("detokenize_big", "/detokenize", b'{"tokens": [' + b"5," * (n // 2 - 8) + b"5]}"),
        ("many_messages", "/v1/chat/completions",
         json.dumps({"messages": [{"role": "user", "content": "hi"}] * (n // 34)}).encode()),
        ("number_overflow", "/v1/chat/completions",
         b'{"messages": [{"role": "user", "content": "hi"}], "temperature": 1e400}'),
        ("bad_utf8", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}'),
    ]


def run_large(fitllm, model, args) -> dict:
    extra = ["--max-body", args.max_body] if args.max_body else []
    srv = Server(fitllm, model, args.mem, ["-t", "1", "-np", "1", "-c", "512", "--max-queue", "2", *extra])
    health = HealthWatch(srv.port)
    kinds = hostile_large(args.large_mb)
    outcomes: dict[str, dict] = {}
    lock = threading.Lock()
    t0 = time.time()

    def one(name, path, body):
        status = send_large(srv.port, path, body)
        with lock:
            outcomes.setdefault(name, {}).setdefault(str(status), 0)
            outcomes[name][str(status)] += 1

    for _ in range(args.rounds):  # every kind at once, twice over
        threads = [threading.Thread(target=one, args=k) for k in kinds * 2]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # A normal request still works between the rounds.
        status, _ = http_request(srv.port, "POST", "/v1/chat/completions", json.dumps(
            {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}), timeout=60)
        outcomes.setdefault("normal_chat", {}).setdefault(str(status), 0)
        outcomes["normal_chat"][str(status)] += 1
    r = {"run": "large", "seconds": round(time.time() - t0, 1), "outcomes": outcomes, **health.finish(),
         **srv.finish(), "flags": "-t 1 -np 1 -c 512 --max-queue 2 --mem " + args.mem + " " + " ".join(extra)}
    r["unanswered"] = sum(n for o in outcomes.values() for s, n in o.items() if s == "None")
    return r


def run_slow(fitllm, model, args) -> dict:
    srv = Server(fitllm, model, args.mem, ["-t", "1", "-np", "1", "-c", "512", "--max-queue", "2"])
    socks = []
    for _ in range(args.connections):
        socks.append(socket.create_connection(("127.0.0.1", srv.port)))
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\n"
    health = HealthWatch(srv.port)
    chats = []
    t0 = time.time()
    i = 0
    while time.time() - t0 < args.seconds:  # one byte from every slow connection each second
        for s in socks:
            try:
                s.send(head[i % len(head):i % len(head) + 1])
            except OSError:
                pass
        i += 1
        t = time.perf_counter()
        status, _ = http_request(srv.port, "POST", "/v1/chat/completions", json.dumps(
            {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}), timeout=30)
        chats.append((status, time.perf_counter() - t))
        time.sleep(max(0.0, 1.0 - (time.perf_counter() - t)))
    open_now = 0
    for s in socks:
        s.setblocking(False)
        try:
            open_now += s.recv(1) != b""
        except BlockingIOError:
            open_now += 1
        except OSError:
            pass
        s.close()
    lat = sorted(c[1] for c in chats)
    r = {"run": "slow", "seconds": round(time.time() - t0, 1), "slow_connections": args.connections,
         "slow_still_open": open_now, "chats": len(chats), "chat_statuses": sorted({c[0] for c in chats}),
         "chat_max_s": lat[-1] if lat else None, "chat_median_s": lat[len(lat) // 2] if lat else None,
         **health.finish(), **srv.finish(), "flags": "-t 1 -np 1 -c 512 --max-queue 2 --mem " + args.mem}
    r["unanswered"] = sum(1 for c in chats if c[0] != 200)
    return r


def soak_client(port, until, rng, tally, lock):
    hostile = [
        ("POST", "/v1/completions", json.dumps({"prompt": "x" * (2 << 20)}), {}),
        ("POST", "/v1/chat/completions", "[" * (1 << 20), {}),
        ("POST", "/v1/chat/completions", '{"messages": [], "temperature": 1e400}', {}),
        ("POST", "/v1/chat/completions", '{"messages": "\\ud800"}', {}),
        ("GET", "/v1/models", None, {"Host": "evil.example"}),
        ("POST", "/v1/completions", '{"prompt": "hi"}', {"Origin": "http://evil.example", "Content-Type": "text/plain"}),
        ("GET", "/v1/completions", None, {}),
        ("POST", "/tokenize", json.dumps({"content": "ab" * (1 << 19)}), {}),
        ("GET", "/health", None, {"X-Big": "b" * 40000}),
    ]
    while time.time() < until:
        roll = rng.random()
        outcome = None
        try:
            if roll < 0.10:  # hostile
                method, path, body, headers = rng.choice(hostile)
                status, _ = http_request(port, method, path, body, headers, timeout=120)
                outcome = ("hostile", status)
            elif roll < 0.20:  # a truncated body, then gone
                s = socket.create_connection(("127.0.0.1", port), timeout=10)
                s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 500\r\n\r\n{\"mess")
                time.sleep(rng.random())
                s.close()
                outcome = ("truncated", "hung up")
            elif roll < 0.55:  # streamed, a third of them hung up early
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
                conn.request("POST", "/v1/chat/completions", json.dumps(
                    {"messages": [{"role": "user", "content": "Tell me a story."}], "stream": True,
                     "max_tokens": rng.randint(8, 96)}))
                r = conn.getresponse()
                if r.status != 200:
                    outcome = ("stream", r.status)
                    r.read()
                elif rng.random() < 0.33:
                    r.read(200)
                    outcome = ("stream", "hung up")
                else:
                    text = r.read().decode(errors="replace")
                    outcome = ("stream", 200 if text.rstrip().endswith("data: [DONE]") else "cut")
                conn.close()
            else:  # whole
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
                conn.request("POST", "/v1/chat/completions", json.dumps(
                    {"messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": rng.randint(8, 64)}))
                if rng.random() < 0.1:
                    time.sleep(0.3)
                    conn.close()
                    outcome = ("whole", "hung up")
                else:
                    r = conn.getresponse()
                    body = r.read()
                    ok = r.status != 200 or json.loads(body)["object"] == "chat.completion"
                    outcome = ("whole", r.status if ok else "bad body")
                    conn.close()
        except (OSError, http.client.HTTPException, ValueError) as e:
            outcome = (outcome[0] if outcome else "error", f"no answer ({type(e).__name__})")
        with lock:
            key = f"{outcome[0]} {outcome[1]}"
            tally[key] = tally.get(key, 0) + 1
        if outcome[1] in (429, 503) and outcome[0] != "hostile":
            time.sleep(1.0)  # as the answer's Retry-After says


def run_soak(fitllm, model, args) -> dict:
    srv = Server(fitllm, model, args.mem, ["-t", "1", "-np", "4", "-c", "2048", "--max-queue", "16"])
    health = HealthWatch(srv.port)
    tally: dict[str, int] = {}
    lock = threading.Lock()
    rss_peak = [0]
    until = time.time() + args.seconds
    t0 = time.time()

    def sample():
        while time.time() < until:
            rss_peak[0] = max(rss_peak[0], srv.status_kib("VmRSS") or 0)
            time.sleep(0.5)

    threads = [threading.Thread(target=soak_client, args=(srv.port, until, random.Random(i), tally, lock))
               for i in range(args.clients)]
    threads.append(threading.Thread(target=sample))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    r = {"run": "soak", "seconds": round(time.time() - t0, 1), "clients": args.clients, "outcomes": tally,
         "requests": sum(tally.values()), "vm_rss_peak_sampled_bytes": rss_peak[0] * 1024, **health.finish(),
         **srv.finish(), "flags": "-t 1 -np 4 -c 2048 --max-queue 16 --mem " + args.mem}
    r["unanswered"] = sum(n for k, n in tally.items() if "no answer" in k or k.endswith(" cut") or "bad body" in k
                          or k.endswith(" 500"))
    return r


def verdict(r: dict) -> list[str]:
    bad = []
    if r.get("unanswered"):
        bad.append(f"{r['unanswered']} requests without a clean answer")
    if not r.get("alive_at_end"):
        bad.append("the server died")
    if r.get("oom_kills"):
        bad.append(f"{r['oom_kills']} OOM kills")
    if r.get("health_max_s") is None or r["health_max_s"] > 1.0:
        bad.append(f"/health took {r.get('health_max_s')} s at worst")
    for key in ("vm_hwm_bytes", "cgroup_peak_bytes"):
        if r.get(key) and r[key] > r["budget_bytes"]:
            bad.append(f"{key} {r[key] >> 20} MiB over the budget {r['budget_bytes'] >> 20} MiB")
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", choices=["large", "slow", "soak", "all"])
    ap.add_argument("--fitllm", default=os.path.join(ROOT, "build", "fitllm"))
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--mem", default="1G")
    ap.add_argument("--max-body", default=None, help="large: the server's --max-body (default: its own)")
    ap.add_argument("--large-mb", type=int, default=30, help="large: MB of each big request (default 30)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--connections", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=None, help="slow: 20, soak: 600 (all: 60)")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    if not os.path.exists(args.model):
        print(f"SKIP: no model at {args.model} (scripts/setup.sh assembles the demo model)")
        sys.exit(77)
    runs = ["large", "slow", "soak"] if args.run == "all" else [args.run]
    results, failed = [], False
    for run in runs:
        a = argparse.Namespace(**vars(args))
        if a.seconds is None:
            a.seconds = {"slow": 20, "soak": 60 if args.run == "all" else 600}.get(run, 0)
        r = {"large": run_large, "slow": run_slow, "soak": run_soak}[run](args.fitllm, args.model, a)
        r["problems"] = verdict(r)
        failed |= bool(r["problems"])
        results.append(r)
        print(json.dumps(r, indent=1, default=str), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
