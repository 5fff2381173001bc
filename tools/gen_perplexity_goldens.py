#!/usr/bin/env python3
"""Perplexity from llama.cpp (PyPI llama-cpp-python), computed the way llama.cpp's
`llama-perplexity` computes it, for fitllm's perplexity test.

  .venv/bin/python tools/gen_perplexity_goldens.py MODEL.gguf TEXT OUT.json [-c 512] [--chunks 4] [-ctk T -ctv T]
      [--no-extra-bufts]

llama-perplexity's method: tokenize the whole text with BOS; cut it into chunks of n_ctx tokens;
evaluate each chunk from an empty KV cache with its first token replaced by BOS; score positions
n_ctx/2 .. n_ctx-2 against the next token (log-softmax: float exp, double sum); PPL =
exp(mean NLL), printed after each chunk. The package does not ship the llama-perplexity binary,
so this script drives the same computation through the C API. Needs `scripts/setup.sh --oracle`.
"""
import argparse
import ctypes
import json
import math

import llama_cpp
import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("text")
    ap.add_argument("out")
    ap.add_argument("-c", "--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("-ctk", "--cache-type-k", default="f16", help="f16, q8_0, q4_0, ... (llama.cpp's type_k)")
    ap.add_argument("-ctv", "--cache-type-v", default="f16")
    ap.add_argument("--no-extra-bufts", action="store_true",
                    help="no repacked weight buffers: on AMX CPUs llama.cpp's IQ4_XS repack crashes on batches")
    args = ap.parse_args()

    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.use_extra_bufts = not args.no_extra_bufts
    model = llama_cpp.llama_model_load_from_file(args.model.encode(), params)
    vocab = llama_cpp.llama_model_get_vocab(model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    add_bos = llama_cpp.llama_vocab_get_add_bos(vocab)
    bos = llama_cpp.llama_vocab_bos(vocab)

    text = open(args.text, "rb").read()
    buf = (llama_cpp.llama_token * (len(text) + 16))()
    n = llama_cpp.llama_tokenize(vocab, text, len(text), buf, len(buf), True, False)
    assert n > 0
    tokens = list(buf[:n])
    n_ctx = args.ctx
    n_chunks = min(args.chunks, len(tokens) // n_ctx)
    first = n_ctx // 2

    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = n_ctx
    cparams.n_batch = n_ctx
    cparams.n_ubatch = n_ctx
    cparams.n_threads = cparams.n_threads_batch = 2
    kv_types = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "iq4_nl": 20, "bf16": 30}
    cparams.type_k = kv_types[args.cache_type_k]
    cparams.type_v = kv_types[args.cache_type_v]
    ctx = llama_cpp.llama_init_from_model(model, cparams)
    mem = llama_cpp.llama_get_memory(ctx)

    nll = nll2 = 0.0
    count = 0
    running = []
    for c in range(n_chunks):
        start = c * n_ctx
        chunk = tokens[start:start + n_ctx]
        if add_bos:
            chunk[0] = bos
        llama_cpp.llama_memory_clear(mem, True)
        batch = llama_cpp.llama_batch_init(n_ctx, 0, 1)
        for i, t in enumerate(chunk):
            batch.token[i] = t
            batch.pos[i] = i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = 1 if i >= first else 0
        batch.n_tokens = n_ctx
        assert llama_cpp.llama_decode(ctx, batch) == 0
        for i in range(first, n_ctx - 1):
            row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, i), shape=(n_vocab,))
            row = row.astype(np.float32)
            mx = row.max()
            sum_exp = float(np.sum(np.exp(row - mx).astype(np.float64)))
            lp = float(row[tokens[start + i + 1]] - mx) - math.log(sum_exp)
            nll -= lp
            nll2 += lp * lp
            count += 1
        llama_cpp.llama_batch_free(batch)
        running.append(math.exp(nll / count))
        print(f"[{c + 1}]{running[-1]:.4f}", flush=True)
    mean = nll / count
    ppl = math.exp(mean)
    var = nll2 / count - mean * mean
    err = math.sqrt(var / (count - 1)) * ppl if var > 0 else 0.0
    out = {"model": args.model.split("/")[-1], "type_k": args.cache_type_k, "type_v": args.cache_type_v, "text": args.text.split("/")[-1], "n_ctx": n_ctx,
           "n_chunks": n_chunks, "n_tokens": len(tokens), "n_scored": count, "ppl": ppl, "ppl_error": err,
           "running_ppl": running, "generator": "tools/gen_perplexity_goldens.py (llama-cpp-python "
           + llama_cpp.__version__ + ")"}
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"Final estimate: PPL = {ppl:.4f} +/- {err:.5f}")


if __name__ == "__main__":
    main()
