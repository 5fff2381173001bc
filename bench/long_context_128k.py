#!/usr/bin/env python3
"""128k tokens of context inside a memory cap smaller than the weights plus an f16 KV cache
(issue 6, "Long context"): a small generated Llama runs a synthetic prompt of LENGTH tokens in
big batches, then decodes at that depth, with the KV cache quantized (q8_0 by default) and
spilled to a file on disk (--kv-spill-dir / --kv-resident), under bench/memcap.py's cgroup cap.
Reports prompt and decode speed, peak memory (the cgroup's, page cache included, and VmHWM),
whether it was killed.

  .venv/bin/python bench/long_context_128k.py [--prompt-lengths 16384] [--fill-lengths 131072]
      [--cap 160M] [--resident 80M] [--ctk q8_0 --ctv q8_0] [--gen 16] [--batch 2048] [--threads 2]
      [--timeout 1800] [--spill-dir build/kv-spill] [--no-spill | --both] [--json]

The model (written on first use, kept in models/bench/): llama-lc128k-q8_0.gguf, 4 layers,
n_embd 256, 4 heads of 64 with 4 KV heads (no GQA, so the KV cache dominates), n_ff 768,
n_ctx_train 131072, the 32000-token SPM vocabulary; about 21 MiB of Q8_0 weights. Its KV cache
at 131072 tokens: f16 512 MiB, q8_0 272 MiB, q4_0 144 MiB (128, 68 and 36 MiB per layer).

Each run is `build/bench/long_context_bench MODEL -c LENGTH+GEN -p LENGTH -n GEN ...` inside
memcap (caches dropped first). Prompt processing is O(LENGTH^2) in attention; a run that passes
--timeout is reported with the depth it reached and its speed there (from its progress lines).
Needs root and cgroup v1 (memcap.py); otherwise it exits 77 saying why.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import memcap  # noqa: E402

MiB = 1 << 20
MODEL = os.path.join(ROOT, "models/bench/llama-lc128k-q8_0.gguf")
KV_BYTES_PER_ELEMENT = {"f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}


def ensure_model() -> str:
    if os.path.exists(MODEL):
        return MODEL
    import gen_bench_models as g

    g.SHAPES["lc128k"] = g.Shape(n_layer=4, n_embd=256, n_head=4, n_head_kv=4, n_ff=768, n_ctx_train=131072,
                                 quants=(("q8_0", 7),))
    os.makedirs(os.path.dirname(MODEL), exist_ok=True)
    f16 = MODEL.replace("-q8_0", "-f16")
    if not os.path.exists(f16):
        g.write_f16(f16 + ".part", "lc128k")
        os.replace(f16 + ".part", f16)
    g.quantize(f16, MODEL + ".part", 7)
    os.replace(MODEL + ".part", MODEL)
    return MODEL


def model_facts(path: str) -> dict:
    import gguf

    r = gguf.GGUFReader(path)
    get = lambda k: int(r.fields[k].contents())  # noqa: E731
    return {"weights_bytes": sum(int(t.n_bytes) for t in r.tensors), "n_layer": get("llama.block_count"),
            "n_head_kv": get("llama.attention.head_count_kv"),
            "head_dim": get("llama.embedding_length") // get("llama.attention.head_count")}


def kv_bytes(facts: dict, n_ctx: int, ctk: str, ctv: str) -> int:
    per = facts["n_layer"] * facts["n_head_kv"] * facts["head_dim"]
    return int(n_ctx * per * (KV_BYTES_PER_ELEMENT[ctk] + KV_BYTES_PER_ELEMENT[ctv]))


def run_one(args, model: str, mode: str, length: int, spill: bool) -> dict:
    n_ctx = length + args.gen
    cmd = [args.bench, model, "-c", str(n_ctx), "-p" if mode == "prompt" else "--fill", str(length), "-n",
           str(args.gen), "-b", str(args.batch),
           "-t", str(args.threads), "-ctk", args.ctk, "-ctv", args.ctv]
    if spill:
        os.makedirs(args.spill_dir, exist_ok=True)
        cmd += ["--kv-spill-dir", args.spill_dir, "--kv-resident", args.resident]
    r = memcap.run_capped(cmd, limit_bytes=memcap.parse_size(args.cap), drop_caches_first=True, capture=True,
                          timeout_s=args.timeout)
    progress = (r.stderr or "").splitlines()
    row = {"mode": mode, "length": length, "spill": spill, "cmd": " ".join(cmd), "cap": args.cap, "status": r.status,
           "peak_mib": r.peak_bytes / MiB if r.peak_bytes is not None else None,
           "max_rss_mib": r.peak_rss_bytes / MiB if r.peak_rss_bytes is not None else None,
           "oom_kills": r.oom_kills, "wall_s": r.wall_s}
    for line in (r.stdout or "").splitlines():
        if line.startswith("{"):
            row.update(json.loads(line))
    prompt_lines = [ln.split() for ln in progress if ln.startswith(("prompt ", "fill "))]
    if prompt_lines:
        row["reached"] = int(prompt_lines[-1][1])
        row["reached_s"] = float(prompt_lines[-1][2])
    decode_lines = [ln.split() for ln in progress if ln.startswith("decode ")]
    if decode_lines:
        row["decoded"] = int(decode_lines[-1][1])
        row["decoded_s"] = float(decode_lines[-1][2])
    row["stderr_tail"] = [ln for ln in progress if not ln.startswith(("prompt ", "fill ", "decode "))][-5:]
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompt-lengths", default="16384",
                    help="real prompts (O(n^2) attention): the lengths to run; empty: none")
    ap.add_argument("--fill-lengths", default="131072",
                    help="K/V filled directly (long_context_bench --fill), then decode at that depth; empty: none")
    ap.add_argument("--cap", default="160M", help="memory cap of each run (memcap.py; page cache included)")
    ap.add_argument("--resident", default="80M", help="--kv-resident: K/V bytes that may stay in memory")
    ap.add_argument("--ctk", default="q8_0", choices=sorted(KV_BYTES_PER_ELEMENT))
    ap.add_argument("--ctv", default="q8_0", choices=sorted(KV_BYTES_PER_ELEMENT))
    ap.add_argument("--gen", type=int, default=16, help="decode steps after the prompt")
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--spill-dir", default=os.path.join(ROOT, "build/kv-spill"))
    ap.add_argument("--no-spill", action="store_true", help="no --kv-spill-dir (the KV cache all in memory)")
    ap.add_argument("--both", action="store_true", help="each length with spill and without (A/B under the same cap)")
    ap.add_argument("--bench", default=os.path.join(ROOT, "build/bench/long_context_bench"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    try:
        memcap.own_memory_cgroup()
    except memcap.CgroupUnavailable as e:
        print(f"skip: {e}", file=sys.stderr)
        return memcap.SKIP_STATUS
    model = ensure_model()
    facts = model_facts(model)
    rows = []
    print(f"model {os.path.relpath(model, ROOT)}: weights {facts['weights_bytes'] / MiB:.1f} MiB; "
          f"load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}", flush=True)
    runs = [("prompt", int(x)) for x in args.prompt_lengths.split(",") if x] + \
           [("fill", int(x)) for x in args.fill_lengths.split(",") if x]
    spills = [True, False] if args.both else [not args.no_spill]
    for mode, length in runs:
        for spill in spills:
            n_ctx = length + args.gen
            f16_kv = kv_bytes(facts, n_ctx, "f16", "f16")
            kv = kv_bytes(facts, n_ctx, args.ctk, args.ctv)
            print(f"\n{mode} {length} tokens: weights + f16 KV = {(facts['weights_bytes'] + f16_kv) / MiB:.0f} MiB, "
                  f"{args.ctk}/{args.ctv} KV {kv / MiB:.0f} MiB, cap {args.cap}, "
                  f"{'spill, resident ' + args.resident if spill else 'no spill'}", flush=True)
            row = run_one(args, model, mode, length, spill)
            rows.append(row)
            print(f"  {row['status']}, peak {row['peak_mib']:.0f} MiB (cgroup, page cache included), "
                  f"OOM kills {row['oom_kills']}, wall {row['wall_s']:.0f} s", flush=True)
            if "prompt_s" in row:
                what = "prompt" if mode == "prompt" else "K/V fill"
                print(f"  {what} {length} tokens in {row['prompt_s']:.1f} s ({row['prompt_tok_s']:.1f} tok/s), "
                      f"decode {row['n_gen']} tokens at depth {length}: {row['gen_tok_s']:.2f} tok/s, "
                      f"VmHWM {row['vm_hwm_kib'] / 1024:.0f} MiB, KV in memory {row['kv_memory_bytes'] / MiB:.0f} MiB, "
                      f"spill file {row['kv_spill_file_bytes'] / MiB:.0f} MiB", flush=True)
            else:
                print(f"  reached {row.get('reached', 0)} tokens in {row.get('reached_s', 0):.0f} s; "
                      f"{row['stderr_tail']}", flush=True)
    print(f"\nload at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
