#!/usr/bin/env python3
"""Prompt processing and generation speed, fitllm against llama.cpp, same model and threads,
alternating in one run; prints tokens/s and the ratio.

  .venv/bin/python bench/bench_vs_llama_cpp.py [MODEL.gguf ...] [-p 512] [-n 128] [-t 2] [-r 3]
  .venv/bin/python bench/bench_vs_llama_cpp.py [--suite] [-p 512] [-n 128] [-t 2] [-r 3]
  .venv/bin/python bench/bench_vs_llama_cpp.py --isa avx2 [--omp-passive] MODEL.gguf ...

Without models (or with --suite) it runs the suite: the demo model (Gemma 3 270M Q4_K_M) and the
1B-shaped random-weight Llama in Q4_K_M and Q8_0 from tools/gen_bench_models.py (models/bench/).
A model that is missing, or that one side cannot run, gets a row saying why; the others still run.

llama.cpp is PyPI's llama-cpp-python (scripts/setup.sh --oracle), driven through its C API:
pp = one llama_decode of p random tokens in a fresh context (n_batch = n_ubatch = 512),
tg = n single-token llama_decode calls; the same definitions `fitllm bench` uses. Rounds alternate
which side runs first. --isa LEVEL (avx2, avx512, avx512_vnni) forces fitllm's kernels to that
level (FITLLM_CPU_ISA) and loads llama.cpp built for the same level by
tools/build_llama_cpp_isa.sh LEVEL (.cache/llama-cpp-LEVEL/lib) instead of the oracle's native
build; --omp-passive sets OMP_WAIT_POLICY=passive for llama.cpp's OpenMP threads.
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

llama_cpp = None  # imported in main(), after --isa / --omp-passive set its environment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


EXTRA_BUFTS = True  # --no-extra-bufts: llama.cpp without repacked weight buffers


def llama_cpp_bench(model_path: str, n_prompt: int, n_gen: int, threads: int, reps: int) -> dict:
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.use_extra_bufts = EXTRA_BUFTS
    model = llama_cpp.llama_model_load_from_file(model_path.encode(), params)
    if not model:
        raise RuntimeError("llama.cpp cannot load the model")
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


FITLLM_ENV = dict(os.environ)  # with --isa: FITLLM_CPU_ISA


def fitllm_bench(model_path: str, n_prompt: int, n_gen: int, threads: int, reps: int) -> dict:
    cmd = [os.path.join(ROOT, "build/fitllm"), "bench", "-m", model_path, "-p", str(n_prompt), "-n", str(n_gen),
           "-t", str(threads), "-r", str(reps), "-o", "json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=FITLLM_ENV)
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        raise RuntimeError(lines[-1] if lines else f"fitllm bench exited with {proc.returncode}")
    rows = json.loads(proc.stdout)
    return {row["test"]: row["samples_ts"] for row in rows}


SUITE = ["models/gemma-3-270m-q4_k_m.gguf", "models/bench/llama-1b-q4_k_m.gguf", "models/bench/llama-1b-q8_0.gguf"]


def fmt(samples: list[float]) -> str:
    sd = statistics.stdev(samples) if len(samples) > 1 else 0
    return f"{statistics.mean(samples):.1f} ± {sd:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="*", help="GGUF files; none = the suite")
    ap.add_argument("--suite", action="store_true",
                    help="the demo model and models/bench/ (tools/gen_bench_models.py), after any MODELs given")
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("-r", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2, help="alternations of fitllm and llama.cpp")
    ap.add_argument("--no-extra-bufts", action="store_true",
                    help="llama.cpp without repacked weight buffers (its AMX repack of IQ4_XS crashes on batches)")
    ap.add_argument("--isa", choices=["avx2", "avx512", "avx512_vnni"],
                    help="both sides at this ISA level: FITLLM_CPU_ISA for fitllm, and llama.cpp from "
                         ".cache/llama-cpp-LEVEL/lib (tools/build_llama_cpp_isa.sh LEVEL)")
    ap.add_argument("--omp-passive", action="store_true", help="OMP_WAIT_POLICY=passive for llama.cpp")
    args = ap.parse_args()
    global EXTRA_BUFTS, llama_cpp
    EXTRA_BUFTS = not args.no_extra_bufts
    if args.isa:
        lib = os.path.join(ROOT, ".cache", f"llama-cpp-{args.isa}", "lib")
        if not os.path.exists(os.path.join(lib, "libllama.so")):
            sys.exit(f"{lib}/libllama.so is missing: run tools/build_llama_cpp_isa.sh {args.isa}")
        os.environ["LLAMA_CPP_LIB_PATH"] = lib
        FITLLM_ENV["FITLLM_CPU_ISA"] = args.isa
    if args.omp_passive:
        os.environ["OMP_WAIT_POLICY"] = "passive"
    import llama_cpp as module  # noqa: E402 (after the environment above)
    llama_cpp = module
    print(f"llama.cpp: {os.environ.get('LLAMA_CPP_LIB_PATH') or 'llama-cpp-python (native build)'}"
          f"{', OMP_WAIT_POLICY=passive' if args.omp_passive else ''}; fitllm: "
          f"{'FITLLM_CPU_ISA=' + args.isa if args.isa else 'native dispatch'}", flush=True)
    llama_cpp.llama_backend_init()
    print("llama.cpp system info:", llama_cpp.llama_print_system_info().decode().strip(), flush=True)
    models = args.models + ([os.path.join(ROOT, m) for m in SUITE] if args.suite or not args.models else [])
    tests = [t for t in (f"pp{args.p}" if args.p else "", f"tg{args.n}" if args.n else "") if t]
    print(f"| model | test | fitllm t/s | llama.cpp t/s | ratio |\n|---|---|---:|---:|---:|", flush=True)
    for model in models:
        name = os.path.basename(model)
        if not os.path.exists(model):
            hint = "tools/gen_bench_models.py" if "/bench/" in model else "scripts/setup.sh"
            print(f"| {name} | - | missing ({hint}) | | |", flush=True)
            continue
        ours, theirs = {}, {}
        errors = {}
        sides = [("fitllm", fitllm_bench, ours), ("llama.cpp", llama_cpp_bench, theirs)]
        for round_ in range(args.rounds):
            for side, run, acc in (sides if round_ % 2 == 0 else sides[::-1]):
                if side in errors:
                    continue
                try:
                    for k, v in run(model, args.p, args.n, args.t, args.r).items():
                        acc.setdefault(k, []).extend(v)
                except Exception as e:  # one side failing on one model must not end the run
                    errors[side] = str(e).replace("|", "/")
        for test in tests:
            a = fmt(ours[test]) if test in ours else "fails: " + errors.get("fitllm", "no result")
            b = fmt(theirs[test]) if test in theirs else "fails: " + errors.get("llama.cpp", "no result")
            ratio = (f"{statistics.mean(ours[test]) / statistics.mean(theirs[test]):.2f}x"
                     if test in ours and test in theirs else "-")
            print(f"| {name} | {test} | {a} | {b} | {ratio} |", flush=True)


if __name__ == "__main__":
    main()
