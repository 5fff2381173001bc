#!/usr/bin/env python3
"""fitllm and llama.cpp under the same memory cap (issue 6, "Proof"): each run in a fresh child
memory cgroup (bench/memcap.py) with the page cache dropped first, alternating the two; prints
decode tokens/s, the cgroup's peak memory (page cache included), max RSS, OOM kills and the exit
status, plus an uncapped row for each.

  .venv/bin/python bench/memcap_vs_llama_cpp.py                      # llama-1b-q8_0, 900M cap, 16 tokens
  .venv/bin/python bench/memcap_vs_llama_cpp.py MODEL.gguf --cap 900M -n 16 -p 16 -t 2 [--rounds 2]
  .venv/bin/python bench/memcap_vs_llama_cpp.py --no-uncapped --skip-llama-cpp --fitllm /tmp/x/fitllm
  .venv/bin/python bench/memcap_vs_llama_cpp.py --omp-passive --rounds 2     # fitllm bench --mem 900M --fit
  .venv/bin/python bench/memcap_vs_llama_cpp.py --stream-layers 7             # the last 7 of 22 layers streamed

Default model: models/bench/llama-1b-q8_0.gguf (1.09 GiB, from tools/gen_bench_models.py), so the
900 MiB cap is smaller than the weights. Needs root (cgroups, drop_caches) and a cgroup v1 memory
controller; exits 77 saying why when they are missing.

llama.cpp: PyPI's llama-cpp-python (scripts/setup.sh --oracle) in a child Python, through the C
API with default model params (mmap, as the llama.cpp tools): load, one llama_decode of p random
tokens (pp, which also pages the weights in), then n single-token llama_decode calls (tg).
fitllm under the cap streams its last layers (docs/architecture.md idea 5, model::LoadOptions). By default
(--stream-layers fit) it runs `fitllm bench -m MODEL -p P -n N -r 1 -t T -o json --mem CAP --fit`:
the plan picks how many layers to stream (it prefaults the resident part and runs one uncounted
warm-up of each test first; the uncapped row is plain `fitllm bench`, everything resident).
--stream-layers K (or auto) runs build/bench/layer_stream_bench -m MODEL --stream-layers K -p P
-n N -t T instead, loading with LoadOptions directly, past the plan, to tune K: it prefaults the
resident part and then, as the llama.cpp side, decodes one prompt of P random tokens and N single
tokens. auto is the fewest last layers whose streaming leaves the resident layers, the output
matrix, kStreamBuffers (2) stream buffers of one layer and 64 MiB of headroom (runtime, KV, page
tables) inside the cap; the token embedding is read a row per token and not counted.
--stream-layers none runs plain `fitllm bench` under the cap too (everything mapped, as llama.cpp).
--fitllm-args adds arguments to `fitllm bench`. tok/s is what each reports for its n decode steps; the
Python child of llama.cpp adds ~40 MiB to its RSS and peak. "load" is the 1-minute load average
when the run started: llama.cpp's OpenMP threads spin at barriers, so on a machine busier than its
cores llama.cpp slows down many times more than fitllm (--omp-passive makes them sleep instead).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import memcap  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MODEL = os.path.join(ROOT, "models/bench/llama-1b-q8_0.gguf")


def llama_cpp_child(model_path: str, n_prompt: int, n_gen: int, threads: int) -> None:
    """Runs inside the cgroup: prints one JSON line {load_s, pp_ts, tg_ts}."""
    import ctypes

    import llama_cpp
    llama_cpp.llama_backend_init()
    t0 = time.perf_counter()
    model = llama_cpp.llama_model_load_from_file(model_path.encode(), llama_cpp.llama_model_default_params())
    if not model:
        raise SystemExit("llama.cpp cannot load the model")
    p = llama_cpp.llama_context_default_params()
    p.n_ctx = n_prompt + n_gen + 16
    p.n_batch = p.n_ubatch = 512
    p.n_threads = p.n_threads_batch = threads
    ctx = llama_cpp.llama_init_from_model(model, p)
    load_s = time.perf_counter() - t0
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    rng = random.Random(42)

    def decode(tokens: list[int]) -> None:
        arr = (llama_cpp.llama_token * len(tokens))(*tokens)
        batch = llama_cpp.llama_batch_get_one(ctypes.cast(arr, ctypes.POINTER(llama_cpp.llama_token)), len(tokens))
        if llama_cpp.llama_decode(ctx, batch) != 0:
            raise SystemExit("llama_decode failed")

    out = {"load_s": load_s}
    if n_prompt:
        t0 = time.perf_counter()
        decode([rng.randrange(n_vocab) for _ in range(n_prompt)])
        out["pp_ts"] = n_prompt / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for _ in range(n_gen):
        decode([rng.randrange(n_vocab)])
    out["tg_ts"] = n_gen / (time.perf_counter() - t0)
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)
    print(json.dumps(out), flush=True)


def last_line(text: str | None) -> str:
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    return lines[-1][:160] if lines else ""


STREAM_BUFFERS = 2  # model::kStreamBuffers (src/model/layer_stream.h)
HEADROOM = 64 << 20  # the runtime, KV cache, activations, page tables: measured ~10 MiB, kept generous


def layer_bytes(model_path: str) -> tuple[list[int], int]:
    """Bytes of each layer's tensors (blk.N.*), and of the other tensors the model reads through
    the mapping (all but a token embedding that the output does not share: read a row per token)."""
    import gguf
    tensors = gguf.GGUFReader(model_path).tensors
    names = {t.name for t in tensors}
    layers: dict[int, int] = {}
    other = 0
    for t in tensors:
        if t.name.startswith("blk."):
            il = int(t.name.split(".")[1])
            layers[il] = layers.get(il, 0) + int(t.n_bytes)
        elif t.name != "token_embd.weight" or "output.weight" not in names:
            other += int(t.n_bytes)
    return [layers[i] for i in sorted(layers)], other


def auto_stream_layers(sizes: list[int], other: int, cap: int) -> int:
    """The fewest last layers to stream so that the rest fits the cap (see the module doc)."""
    for k in range(0, len(sizes) + 1):
        resident = other + sum(sizes[:len(sizes) - k])
        staging = STREAM_BUFFERS * max(sizes[len(sizes) - k:], default=0)
        if resident + staging + HEADROOM <= cap:
            return k
    return len(sizes)


def run_one(side: str, args, cap: int | None) -> dict:
    if side == "llama.cpp":
        cmd = [sys.executable, os.path.abspath(__file__), "--llama-cpp-child", args.model,
               str(args.p), str(args.n), str(args.t)]
        label = "llama.cpp"
    elif isinstance(args.stream_layers, int):
        k = args.stream_layers if cap is not None else 0
        cmd = [args.stream_bench, "-m", args.model, "--stream-layers", str(k), "-p", str(args.p),
               "-n", str(args.n), "-t", str(args.t)]
        label = f"fitllm (stream {k}/{args.n_layer})" if k else "fitllm (resident)"
    else:
        fit = args.stream_layers == "fit" and cap is not None
        cmd = [args.fitllm, "bench", "-m", args.model, "-p", str(args.p), "-n", str(args.n), "-r", "1",
               "-t", str(args.t), "-o", "json"] + (["--mem", str(cap), "--fit"] if fit else []) \
            + args.fitllm_args.split()
        label = "fitllm" + (" (--fit)" if fit else "") + (f" ({args.fitllm_args})" if args.fitllm_args else "")
    env = dict(os.environ, OMP_WAIT_POLICY="passive") if side == "llama.cpp" and args.omp_passive else None
    load = os.getloadavg()[0]
    r = memcap.run_capped(cmd, cap, drop_caches_first=not args.warm, timeout_s=args.timeout, capture=True,
                          cwd=ROOT, env=env)
    label += " (OMP passive)" if env else ""
    row = {"runtime": label, "cap_bytes": cap, "loadavg_1m": load,
           "status": r.status, "wall_s": r.wall_s, "peak_bytes": r.peak_bytes,
           "peak_rss_bytes": r.peak_rss_bytes, "oom_kills": r.oom_kills, "failcnt": r.failcnt,
           "memsw_limited": r.memsw_limited, "pp_ts": None, "tg_ts": None, "error": None}
    if r.returncode == 0:
        try:
            if side == "llama.cpp":
                d = json.loads(last_line(r.stdout))
                row["pp_ts"], row["tg_ts"], row["load_s"] = d.get("pp_ts"), d["tg_ts"], d["load_s"]
            else:
                for t in json.loads(r.stdout):
                    row["pp_ts" if t["test"].startswith("pp") else "tg_ts"] = t["avg_ts"]
        except (ValueError, KeyError) as e:
            row["error"] = f"unreadable output: {e}"
    else:
        row["error"] = last_line(r.stderr) or last_line(r.stdout)
    return row


def fmt_ts(x: float | None) -> str:
    return "-" if x is None else (f"{x:.2f}" if x < 10 else f"{x:.1f}")


def print_row(row: dict, baseline: float | None) -> None:
    """baseline: llama.cpp's mean decode speed under the same cap so far, for the ratio column."""
    cap = "none" if row["cap_bytes"] is None else f"{row['cap_bytes'] >> 20} MiB"
    status = row["status"] + (f": {row['error']}" if row["error"] and row["status"] != "exit 0" else "")
    ratio = f"{row['tg_ts'] / baseline:.2f}x" if baseline and row["tg_ts"] is not None else "-"
    print(f"| {row['runtime']} | {cap} | {fmt_ts(row['pp_ts'])} | {fmt_ts(row['tg_ts'])} | {ratio} "
          f"| {row['wall_s']:.1f} "
          f"| {memcap.fmt_mib(row['peak_bytes']).split()[0]} | {memcap.fmt_mib(row['peak_rss_bytes']).split()[0]} "
          f"| {row['oom_kills']} | {status.replace('|', '/')} | {row['loadavg_1m']:.1f} |", flush=True)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--llama-cpp-child":
        model, n_prompt, n_gen, threads = sys.argv[2], *map(int, sys.argv[3:6])
        llama_cpp_child(model, n_prompt, n_gen, threads)
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default=DEFAULT_MODEL)
    ap.add_argument("--cap", default="900M", help="memory cap, binary units (default 900M = 900 MiB)")
    ap.add_argument("-n", type=int, default=16, help="tokens to generate (default 16)")
    ap.add_argument("-p", type=int, default=16, help="prompt tokens decoded first (default 16)")
    ap.add_argument("-t", type=int, default=2, help="threads (default 2)")
    ap.add_argument("--rounds", type=int, default=1, help="alternations of llama.cpp and fitllm (default 1)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds before a run is killed (default 900)")
    ap.add_argument("--fitllm", default=os.path.join(ROOT, "build/fitllm"), help="the fitllm executable")
    ap.add_argument("--stream-bench", default=os.path.join(ROOT, "build/bench/layer_stream_bench"),
                    help="the streaming benchmark executable (bench/layer_stream_bench.cpp)")
    ap.add_argument("--stream-layers", default="fit",
                    help="fitllm under the cap: fit (default: `fitllm bench --mem CAP --fit`), K or auto "
                         "(layer_stream_bench streaming the last K layers), none (plain `fitllm bench`)")
    ap.add_argument("--fitllm-args", default="", help="extra arguments for `fitllm bench`")
    ap.add_argument("--no-uncapped", action="store_true", help="skip the uncapped rows")
    ap.add_argument("--skip-llama-cpp", action="store_true")
    ap.add_argument("--skip-fitllm", action="store_true")
    ap.add_argument("--omp-passive", action="store_true",
                    help="run llama.cpp with OMP_WAIT_POLICY=passive: its OpenMP threads sleep instead of spinning "
                         "at barriers, which on a busy machine (load above the core count) is many times faster")
    ap.add_argument("--warm", action="store_true", help="do not drop the page cache before each run")
    ap.add_argument("--json", metavar="FILE", help="also write every row as JSON to FILE")
    ap.add_argument("--target", type=float, default=3.0,
                    help="the decode speed ratio over llama.cpp under the cap to meet (default 3; issue 21's MoE: 4)")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda s, f: sys.exit(128 + s))  # so the cgroup of a run is removed
    args.model = os.path.abspath(args.model)
    if not os.path.exists(args.model):
        print(f"missing model {args.model} (tools/gen_bench_models.py writes models/bench/)", file=sys.stderr)
        return 2
    sides = [s for s, skip in (("llama.cpp", args.skip_llama_cpp), ("fitllm", args.skip_fitllm)) if not skip]
    cap = memcap.parse_size(args.cap)
    try:
        sizes, other = layer_bytes(args.model)
    except ImportError:
        print("the gguf package is missing (scripts/setup.sh)", file=sys.stderr)
        return 2
    args.n_layer = len(sizes)
    if args.stream_layers == "auto":
        args.stream_layers = auto_stream_layers(sizes, other, cap)
    elif args.stream_layers not in ("fit", "none"):
        args.stream_layers = int(args.stream_layers)
    for exe in ([args.stream_bench] if isinstance(args.stream_layers, int) else [args.fitllm]) \
            if "fitllm" in sides else []:
        if not os.access(exe, os.X_OK):
            print(f"missing {exe} (build it: cmake --build build)", file=sys.stderr)
            return 2
    if "llama.cpp" in sides:
        try:
            import llama_cpp  # noqa: F401
        except ImportError:
            print("llama-cpp-python is missing (scripts/setup.sh --oracle)", file=sys.stderr)
            return 2
    try:
        memcap.own_memory_cgroup()
    except memcap.CgroupUnavailable as e:
        print(f"skipped: {e}", file=sys.stderr)
        return memcap.SKIP_STATUS
    size = os.path.getsize(args.model)
    print(f"model {os.path.relpath(args.model, ROOT)} ({size / (1 << 30):.2f} GiB), cap {cap >> 20} MiB, "
          f"pp {args.p} + tg {args.n} tokens, {args.t} threads, "
          f"{'warm' if args.warm else 'page cache dropped before each run'}; fitllm under the cap: "
          f"{args.stream_layers if isinstance(args.stream_layers, str) else 'the last %d' % args.stream_layers} "
          f"streamed layers\n")
    print("| runtime | cap | pp tok/s | tg tok/s (decode) | tg vs llama.cpp | wall s | peak MiB (cgroup) "
          "| max RSS MiB | OOM kills | status | load |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|", flush=True)
    rows = []
    try:
        caps = ([None] if not args.no_uncapped else []) + [cap] * args.rounds
        for c in caps:
            for side in sides:
                try:
                    row = run_one(side, args, c)
                except memcap.CgroupUnavailable as e:
                    print(f"skipped: {e}", file=sys.stderr)
                    return memcap.SKIP_STATUS
                rows.append(row)
                theirs = [r["tg_ts"] for r in rows if r["runtime"].startswith("llama.cpp") and r["cap_bytes"] == c
                          and r["tg_ts"] is not None]
                print_row(row, sum(theirs) / len(theirs) if theirs and side == "fitllm" else None)
    except KeyboardInterrupt:
        print("interrupted; the running command was killed and its cgroup removed", file=sys.stderr)
        return 130
    finally:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=2)
    capped = {s: [r["tg_ts"] for r in rows if r["runtime"].split()[0] == s and r["cap_bytes"] == cap] for s in sides}
    kills = sum(r["oom_kills"] for r in rows if r["runtime"].startswith("fitllm") and r["cap_bytes"] == cap)
    if len(sides) == 2 and capped["fitllm"] and capped["llama.cpp"]:
        ours = [x for x in capped["fitllm"] if x is not None]
        theirs = [x for x in capped["llama.cpp"] if x is not None]
        if ours and theirs:
            ratio = (sum(ours) / len(ours)) / (sum(theirs) / len(theirs))
            print(f"\nunder {cap >> 20} MiB: fitllm decodes at {ratio:.2f}x llama.cpp's speed, {kills} OOM kills "
                  f"(target: >= {args.target:g}x, 0 kills): "
                  f"{'met' if ratio >= args.target and kills == 0 else 'not met'}")
        else:
            print(f"\nunder {cap >> 20} MiB: no decode speed for "
                  f"{'fitllm' if not ours else 'llama.cpp'}; fitllm OOM kills {kills} (target: >= {args.target:g}x, "
                  f"0 kills): not met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
