#!/usr/bin/env python3
"""Prompt processing and generation speed, fitllm against llama.cpp, same model and threads,
alternating in one run; prints tokens/s and the ratio.

  .venv/bin/python bench/bench_vs_llama_cpp.py [MODEL.gguf ...] [-p 512] [-n 128] [-t 2] [-r 3]

llama.cpp is PyPI's llama-cpp-python (scripts/setup.sh --oracle), driven through its C API:
pp = one llama_decode of p random tokens in a fresh context (n_batch = n_ubatch = 512),
tg = n single-token llama_decode calls; the same definitions `fitllm bench` uses.
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import time

import llama_cpp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def llama_cpp_bench(model_path: str, n_prompt: int, n_gen: int, threads: int, reps: int) -> dict:
    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(model_path.encode(), llama_cpp.llama_model_default_params())
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    rng = random.Random(42)

    def fresh_context():
        p = llama_cpp.llama_context_default_params()
        p.n_ctx = n_prompt + n_gen + 16
        p.n_batch = p.n_ubatch = 512
        p.n_threads = p.n_threads_batch = threads
        return llama_cpp.llama_init_from_model(model, p)

    def decode(ctx, tokens):
        arr = (llama_cpp.llama_token * len(tokens))(*tokens)
        for start in range(0, len(tokens), 512):
            n = min(512, len(tokens) - start)
            batch = llama_cpp.llama_batch_get_one(
                llama_cpp.ctypes.cast(llama_cpp.ctypes.addressof(arr) + 4 * start,
                                      llama_cpp.ctypes.POINTER(llama_cpp.llama_token)), n)
            assert llama_cpp.llama_decode(ctx, batch) == 0

    out = {}
    if n_prompt:
        times = []
        for r in range(reps + 1):
            ctx = fresh_context()
            toks = [rng.randrange(n_vocab) for _ in range(n_prompt)]
            t0 = time.perf_counter()
            decode(ctx, toks)
            if r:
                times.append(time.perf_counter() - t0)
            llama_cpp.llama_free(ctx)
        out[f"pp{n_prompt}"] = [n_prompt / t for t in times]
    if n_gen:
        times = []
        for r in range(reps + 1):
            ctx = fresh_context()
            t0 = time.perf_counter()
            for _ in range(n_gen):
                decode(ctx, [rng.randrange(n_vocab)])
            if r:
                times.append(time.perf_counter() - t0)
            llama_cpp.llama_free(ctx)
        out[f"tg{n_gen}"] = [n_gen / t for t in times]
    llama_cpp.llama_model_free(model)
    return out


def fitllm_bench(model_path: str, n_prompt: int, n_gen: int, threads: int, reps: int) -> dict:
    cmd = [os.path.join(ROOT, "build/fitllm"), "bench", "-m", model_path, "-p", str(n_prompt), "-n", str(n_gen),
           "-t", str(threads), "-r", str(reps), "-o", "json"]
    rows = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    return {row["test"]: row["samples_ts"] for row in rows}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="*", default=[os.path.join(ROOT, "models/gemma-3-270m-q4_k_m.gguf")])
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("-r", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2, help="alternations of fitllm and llama.cpp")
    args = ap.parse_args()
    print(f"| model | test | fitllm t/s | llama.cpp t/s | ratio |\n|---|---|---:|---:|---:|")
    for model in args.models:
        ours, theirs = {}, {}
        for _ in range(args.rounds):
            for k, v in fitllm_bench(model, args.p, args.n, args.t, args.r).items():
                ours.setdefault(k, []).extend(v)
            for k, v in llama_cpp_bench(model, args.p, args.n, args.t, args.r).items():
                theirs.setdefault(k, []).extend(v)
        for test in ours:
            a, b = statistics.mean(ours[test]), statistics.mean(theirs[test])
            sa = statistics.stdev(ours[test]) if len(ours[test]) > 1 else 0
            sb = statistics.stdev(theirs[test]) if len(theirs[test]) > 1 else 0
            print(f"| {os.path.basename(model)} | {test} | {a:.1f} ± {sa:.1f} | {b:.1f} ± {sb:.1f} | {a / b:.2f}x |")


if __name__ == "__main__":
    main()
