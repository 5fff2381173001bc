#!/usr/bin/env python3
"""Greedy continuations and top logits from llama.cpp (PyPI llama-cpp-python) for fitllm's
forward-pass tests.

  .venv/bin/python tools/gen_model_goldens.py MODEL.gguf OUT.json [--n-predict 64]

For each prompt: its ids (add_special and parse_special on), the top-10 (id, logit) at the last
prompt position, and the 64 tokens greedy decoding appends. One of the prompts is longer than
Gemma 3's 512-token sliding window. Needs `scripts/setup.sh --oracle`.
"""
import argparse
import ctypes
import json

import llama_cpp

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "<start_of_turn>user\nWrite a haiku about autumn leaves.<end_of_turn>\n<start_of_turn>model\n",
    "Translate to German: The weather is nice today.\nGerman:",
    "1, 1, 2, 3, 5, 8, 13,",
    # Longer than the 512-token sliding window of Gemma 3's local layers.
    "Here is a list of facts about numbers.\n" + "".join(
        f"Fact {i}: the square of {i} is {i * i}, and {i} plus {i} is {2 * i}.\n" for i in range(1, 41))
    + "Fact 41:",
]


def tokenize(vocab, text: str) -> list[int]:
    b = text.encode("utf-8")
    buf = (llama_cpp.llama_token * (len(b) + 16))()
    n = llama_cpp.llama_tokenize(vocab, b, len(b), buf, len(buf), True, True)
    assert n >= 0
    return list(buf[:n])


def decode(ctx, tokens: list[int]) -> None:
    arr = (llama_cpp.llama_token * len(tokens))(*tokens)
    batch = llama_cpp.llama_batch_get_one(arr, len(tokens))
    rc = llama_cpp.llama_decode(ctx, batch)
    if rc != 0:
        raise RuntimeError(f"llama_decode returned {rc}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--n-predict", type=int, default=64)
    args = ap.parse_args()
    llama_cpp.llama_backend_init()
    mparams = llama_cpp.llama_model_default_params()
    model = llama_cpp.llama_model_load_from_file(args.model.encode(), mparams)
    vocab = llama_cpp.llama_model_get_vocab(model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    cases = []
    for prompt in PROMPTS:
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = 2048
        cparams.n_batch = 2048
        cparams.n_ubatch = 512
        cparams.n_threads = 2
        cparams.n_threads_batch = 2
        ctx = llama_cpp.llama_init_from_model(model, cparams)
        ids = tokenize(vocab, prompt)
        decode(ctx, ids)
        logits = ctypes.cast(llama_cpp.llama_get_logits_ith(ctx, -1), ctypes.POINTER(ctypes.c_float))
        row = [logits[i] for i in range(n_vocab)]
        top = sorted(range(n_vocab), key=lambda i: -row[i])[:10]
        greedy = []
        nxt = top[0]
        for _ in range(args.n_predict):
            greedy.append(nxt)
            decode(ctx, [nxt])
            lg = ctypes.cast(llama_cpp.llama_get_logits_ith(ctx, -1), ctypes.POINTER(ctypes.c_float))
            nxt = max(range(n_vocab), key=lambda i: lg[i])
        cases.append({"prompt": prompt, "prompt_ids": ids, "greedy_ids": greedy,
                      "top_logits": [[i, row[i]] for i in top]})
        llama_cpp.llama_free(ctx)
        print(f"{len(ids):4d} prompt tokens -> {len(greedy)} greedy tokens")
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"model": args.model.split("/")[-1], "llama_cpp_python": llama_cpp.__version__,
                   "n_threads": 2, "cases": cases}, f, ensure_ascii=False, indent=1)


if __name__ == "__main__":
    main()
