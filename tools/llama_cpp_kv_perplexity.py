#!/usr/bin/env python3
"""llama.cpp's perplexity (PyPI llama-cpp-python) with a quantized KV cache, and its KL from f16.

  .venv/bin/python tools/llama_cpp_kv_perplexity.py MODEL.gguf TEXT [-c 512] [--chunks 8] \\
      [--types f16,q8_0,q4_0] [--threads 2]

For each K/V type (K and V the same; "K/V" such as q8_0/q4_0 for different ones) it computes the
perplexity the way `llama-perplexity` does (tokenize the text with BOS, chunks of n_ctx tokens from
an empty cache with the first token replaced by BOS, positions n_ctx/2 .. n_ctx-2 scored against
the next token), which is also how `fitllm perplexity` computes it, so the numbers compare. Flash
attention is on for every type (llama.cpp needs it for a quantized V cache); llama.cpp does not
rotate K/V. The first type is the reference: every other one also gets the mean KL divergence of
its next-token distributions from the reference's, over the reference's top 32 tokens plus the
rest of the mass (the measure the README's KV table uses).
"""
import argparse
import ctypes
import math

import llama_cpp
import numpy as np

KV_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "iq4_nl": 20, "bf16": 30}
TOP = 32
# llama.cpp's log lines (model loading, context setup) are dropped; kept alive for the C side.
_QUIET = llama_cpp.llama_log_callback(lambda level, text, user_data: None)


def log_softmax(row):
    row = row.astype(np.float64)
    mx = row.max()
    return row - mx - math.log(float(np.sum(np.exp(row - mx))))


def run(model, vocab, tokens, n_ctx, n_chunks, type_k, type_v, threads, reference):
    """PPL (and KL from reference's top tokens when given); returns (ppl, err, kl, top) ."""
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    add_bos = llama_cpp.llama_vocab_get_add_bos(vocab)
    bos = llama_cpp.llama_vocab_bos(vocab)
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = n_ctx
    cparams.n_batch = n_ctx
    cparams.n_ubatch = n_ctx
    cparams.n_threads = cparams.n_threads_batch = threads
    cparams.type_k = KV_TYPES[type_k]
    cparams.type_v = KV_TYPES[type_v]
    cparams.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
    ctx = llama_cpp.llama_init_from_model(model, cparams)
    if not ctx:
        raise SystemExit(f"llama.cpp refused a context with K {type_k} / V {type_v}")
    mem = llama_cpp.llama_get_memory(ctx)
    first = n_ctx // 2
    nll = nll2 = kl = 0.0
    count = 0
    top = []
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
        if llama_cpp.llama_decode(ctx, batch) != 0:
            raise SystemExit(f"llama_decode failed on chunk {c}")
        for i in range(first, n_ctx - 1):
            row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, i), shape=(n_vocab,)).astype(np.float32)
            lp = log_softmax(row)
            target = tokens[start + i + 1]
            nll -= lp[target]
            nll2 += lp[target] ** 2
            if reference is None:
                idx = np.argpartition(-lp, TOP)[:TOP]
                top.append((idx, lp[idx]))
            else:
                idx, ref = reference[count]
                pr, pq = np.exp(ref), np.exp(lp[idx])
                k = float(np.sum(pr * (ref - lp[idx])))
                rest_r, rest_q = 1.0 - pr.sum(), 1.0 - pq.sum()
                if rest_r > 0 and rest_q > 0:
                    k += rest_r * math.log(rest_r / rest_q)
                kl += k
            count += 1
        llama_cpp.llama_batch_free(batch)
    llama_cpp.llama_free(ctx)
    mean = nll / count
    ppl = math.exp(mean)
    var = nll2 / count - mean * mean
    err = math.sqrt(var / (count - 1)) * ppl if var > 0 else 0.0
    return ppl, err, (kl / count if reference is not None else 0.0), top


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("text")
    ap.add_argument("-c", "--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--types", default="f16,q8_0,q4_0", help="comma list; the first is the KL reference")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    llama_cpp.llama_log_set(_QUIET, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(args.model.encode(), llama_cpp.llama_model_default_params())
    if not model:
        raise SystemExit(f"cannot load {args.model}")
    vocab = llama_cpp.llama_model_get_vocab(model)
    text = open(args.text, "rb").read()
    buf = (llama_cpp.llama_token * (len(text) + 16))()
    n = llama_cpp.llama_tokenize(vocab, text, len(text), buf, len(buf), True, False)
    if n <= 0:
        raise SystemExit("tokenization failed")
    tokens = list(buf[:n])
    n_chunks = min(args.chunks, len(tokens) // args.ctx)
    print(f"llama-cpp-python {llama_cpp.__version__}: {n} tokens, {n_chunks} chunks of {args.ctx}, flash attention on")
    reference = None
    ref_ppl = None
    for spec in args.types.split(","):
        type_k, _, type_v = spec.partition("/")
        type_v = type_v or type_k
        ppl, err, kl, top = run(model, vocab, tokens, args.ctx, n_chunks, type_k, type_v, args.threads, reference)
        if reference is None:
            reference, ref_ppl = top, ppl
            print(f"K {type_k:6s} V {type_v:6s} PPL {ppl:.4f} +/- {err:.5f}  (reference)", flush=True)
        else:
            print(f"K {type_k:6s} V {type_v:6s} PPL {ppl:.4f} +/- {err:.5f}  vs ref {100 * (ppl / ref_ppl - 1):+.2f}%"
                  f"  KL {kl:.4f}", flush=True)
    llama_cpp.llama_model_free(model)


if __name__ == "__main__":
    main()
