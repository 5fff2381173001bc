#!/usr/bin/env python3
"""Tokenization throughput (MB/s): fitllm against llama.cpp, same model, same text, one run.

  .venv/bin/python bench/tokenize_vs_llama_cpp.py [MODEL.gguf] [--mb 2] [--repeats 5]

The text is the licence texts Debian ships (/usr/share/common-licenses), repeated to --mb MB.
llama.cpp is PyPI's llama-cpp-python (scripts/setup.sh --oracle); its time is one llama_tokenize
call on the whole text through ctypes, so the Python overhead is a constant few microseconds.
"""
import argparse
import glob
import json
import os
import subprocess
import tempfile
import time

import llama_cpp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_text(mb: float) -> bytes:
    parts = []
    for path in sorted(glob.glob("/usr/share/common-licenses/*")):
        if os.path.isfile(path):
            with open(path, "rb") as f:
                parts.append(f.read())
    base = b"\n".join(parts)
    target = int(mb * 1e6)
    return (base * (target // len(base) + 1))[:target].decode("utf-8", "ignore").encode("utf-8")


def llama_cpp_tokenize(model_path: str, text: bytes, repeats: int) -> dict:
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(model_path.encode(), params)
    vocab = llama_cpp.llama_model_get_vocab(model)
    n_max = len(text) + 16
    buf = (llama_cpp.llama_token * n_max)()
    best = 1e30
    n = 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        n = llama_cpp.llama_tokenize(vocab, text, len(text), buf, n_max, True, False)
        best = min(best, time.perf_counter() - t0)
    llama_cpp.llama_model_free(model)
    return {"bytes": len(text), "tokens": n, "best_s": best, "mb_per_s": len(text) / 1e6 / best}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default=os.path.join(ROOT, "models/gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--mb", type=float, default=2.0)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--bench-bin", default=os.path.join(ROOT, "build/bench/tokenize_bench"))
    args = ap.parse_args()
    text = make_text(args.mb)
    with tempfile.NamedTemporaryFile(suffix=".txt") as f:
        f.write(text)
        f.flush()
        out = subprocess.run([args.bench_bin, args.model, f.name, str(args.repeats)],
                             check=True, capture_output=True, text=True).stdout
    ours = json.loads(out)
    theirs = llama_cpp_tokenize(args.model, text, args.repeats)
    print(f"model: {os.path.basename(args.model)}, text: {len(text) / 1e6:.2f} MB of licence texts, best of {args.repeats}")
    print(f"{'':12} {'tokens':>10} {'seconds':>9} {'MB/s':>8}")
    print(f"{'fitllm':12} {ours['tokens']:>10} {ours['best_s']:>9.3f} {ours['mb_per_s']:>8.2f}")
    print(f"{'llama.cpp':12} {theirs['tokens']:>10} {theirs['best_s']:>9.3f} {theirs['mb_per_s']:>8.2f}")
    print(f"{'ratio':12} {'same' if ours['tokens'] == theirs['tokens'] else 'DIFFERENT':>10} "
          f"{'':>9} {ours['mb_per_s'] / theirs['mb_per_s']:>7.2f}x")


if __name__ == "__main__":
    main()
