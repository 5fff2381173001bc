#!/usr/bin/env python3
"""Greedy continuations and top logits from llama.cpp (PyPI llama-cpp-python) for fitllm's
forward-pass tests.

  .venv/bin/python tools/gen_model_goldens.py MODEL.gguf OUT.json [--n-predict 64]
  .venv/bin/python tools/gen_model_goldens.py --generated [--only NAME ...] [--no-extra-bufts] [--n-predict 64]

For each prompt: its ids (add_special and parse_special on), the top-10 (id, logit) at the last
prompt position, and the 64 tokens greedy decoding appends, with llama.cpp's margin between its
best and second-best logit at each of those steps. One of the prompts is longer than Gemma 3's
512-token sliding window. Needs `scripts/setup.sh --oracle`.

--generated does the same for each small random-weight model in tests/model/data/ (written by
tools/gen_test_models.py) with TINY_PROMPTS, into tests/model/goldens/<model name>.json, which
tests/model/generated_golden_test.cpp checks; --only tiny-qwen3-q8_0 ... limits it to those files.

--no-extra-bufts loads the weights into plain CPU buffers (llama_model_params.use_extra_bufts off:
no repacking). Needed on CPUs with AMX, where llama.cpp repacks IQ4_XS (and other types) for its
AMX kernels and its IQ4_XS path crashes on multi-token batches (seen with llama-cpp-python
0.3.36 on a Xeon with AMX-INT8); the goldens then come from ggml's plain dot and sgemm kernels.
Regenerating on another CPU moves the logits by float-rounding noise (the ISA's summation orders),
within the tests' tolerances.

--cpu-repack q4_K ... (with --no-extra-bufts) puts the tensors of those types, and only those, in
llama.cpp's CPU_REPACK buffers (tensor_buft_overrides): its repacked AVX2 / AVX-512 gemm, what a
CPU without AMX runs by default, in place of the AMX kernels that the default picks here. fitllm's
batch kernels for Q4_K follow that repacked order, so a prompt's logits are llama.cpp's bits.
(Its Q6_K repack crashes in llama-cpp-python 0.3.36 on this CPU: Q6_K stays in plain buffers,
whose order fitllm's Q6_K batch kernels follow too.)
"""
import argparse
import ctypes
import glob
import json
import os

import gguf
import llama_cpp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

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

# For the tiny models of tests/model/data/: their vocabularies have a few hundred tokens, so most
# text becomes single characters. From one token (llama's BOS alone; qwen2 adds no BOS, so "" is
# skipped there) to more than 200.
TINY_PROMPTS = [
    "",
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
    "<|im_start|>user\nWrite a haiku about autumn leaves.<|im_end|>\n<|im_start|>assistant\n",
    "Here is a list of facts about numbers.\n" + "".join(
        f"Fact {i}: the square of {i} is {i * i}, and {i} plus {i} is {2 * i}.\n" for i in range(1, 9))
    + "Fact 9:",
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


def last_logits(ctx, n_vocab: int) -> list[float]:
    lg = ctypes.cast(llama_cpp.llama_get_logits_ith(ctx, -1), ctypes.POINTER(ctypes.c_float))
    return lg[:n_vocab]


class TensorBuftOverride(ctypes.Structure):  # llama.h's llama_model_tensor_buft_override
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def cpu_repack_overrides(model_path: str, types: list[str]):
    """A NULL-terminated llama_model_tensor_buft_override array that sends the file's tensors of
    these ggml types (names as gguf-py's GGMLQuantizationType: Q4_K ...) to the CPU backend's
    CPU_REPACK buffer type (found through ggml_backend_dev_get_extra_bufts); None when none match."""
    lib = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    base = ctypes.CDLL(os.path.join(lib, "libggml-base.so"))
    ggml = ctypes.CDLL(os.path.join(lib, "libggml.so"))
    ggml.ggml_backend_dev_by_type.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
    base.ggml_backend_dev_backend_reg.restype = ctypes.c_void_p
    base.ggml_backend_dev_backend_reg.argtypes = [ctypes.c_void_p]
    base.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
    base.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    base.ggml_backend_buft_name.restype = ctypes.c_char_p
    base.ggml_backend_buft_name.argtypes = [ctypes.c_void_p]
    dev = ggml.ggml_backend_dev_by_type(0)  # GGML_BACKEND_DEVICE_TYPE_CPU
    get = base.ggml_backend_reg_get_proc_address(base.ggml_backend_dev_backend_reg(dev),
                                                 b"ggml_backend_dev_get_extra_bufts")
    bufts = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(get)(dev)
    repack, i = None, 0
    while bufts[i]:
        if base.ggml_backend_buft_name(bufts[i]) == b"CPU_REPACK":
            repack = bufts[i]
        i += 1
    if repack is None:
        raise RuntimeError("llama.cpp's CPU backend has no CPU_REPACK buffer type")
    wanted = {t.upper() for t in types}
    # Not the token embedding: llama.cpp reads it with get_rows, which repacked buffers lack (its
    # default leaves it in a plain buffer; overridden, the scheduler aborts).
    names = [t.name for t in gguf.GGUFReader(model_path).tensors
             if t.tensor_type.name.upper() in wanted and t.name != "token_embd.weight"]
    if not names:
        return None
    pattern = "^(" + "|".join(n.replace(".", "\\.") for n in names) + ")$"
    return (TensorBuftOverride * 2)(TensorBuftOverride(pattern.encode(), repack), TensorBuftOverride(None, None))


def goldens(model_path: str, prompts: list[str], n_predict: int, extra_bufts: bool = True,
            cpu_repack: list[str] | None = None) -> dict:
    params = llama_cpp.llama_model_default_params()
    params.use_extra_bufts = extra_bufts
    overrides = cpu_repack_overrides(model_path, cpu_repack) if cpu_repack else None
    if overrides is not None:
        params.tensor_buft_overrides = ctypes.cast(overrides, ctypes.c_void_p)
    model = llama_cpp.llama_model_load_from_file(model_path.encode(), params)
    if not model:
        raise RuntimeError(f"llama.cpp cannot load {model_path}")
    vocab = llama_cpp.llama_model_get_vocab(model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    cases = []
    for prompt in prompts:
        ids = tokenize(vocab, prompt)
        if not ids:
            continue
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = 2048
        cparams.n_batch = 2048
        cparams.n_ubatch = 512
        cparams.n_threads = 2
        cparams.n_threads_batch = 2
        ctx = llama_cpp.llama_init_from_model(model, cparams)
        decode(ctx, ids)
        row = last_logits(ctx, n_vocab)
        top = sorted(range(n_vocab), key=lambda i: -row[i])[:10]
        top_logits = [[i, row[i]] for i in top]
        greedy, margins = [], []
        for _ in range(n_predict):
            first, second = sorted(range(n_vocab), key=lambda i: -row[i])[:2]
            greedy.append(first)
            margins.append(round(row[first] - row[second], 5))
            decode(ctx, [first])
            row = last_logits(ctx, n_vocab)
        cases.append({"prompt": prompt, "prompt_ids": ids, "greedy_ids": greedy, "top_logits": top_logits,
                      "greedy_margins": margins})
        llama_cpp.llama_free(ctx)
        print(f"{len(ids):4d} prompt tokens -> {len(greedy)} greedy tokens ({len(set(greedy))} distinct), "
              f"smallest margin {min(margins):.4f}")
    llama_cpp.llama_model_free(model)
    return {"model": os.path.basename(model_path), "llama_cpp_python": llama_cpp.__version__, "n_threads": 2,
            "cases": cases}


def write(out: str, data: dict) -> None:
    with open(out, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, indent=1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?")
    ap.add_argument("out", nargs="?")
    ap.add_argument("--generated", action="store_true",
                    help="every tests/model/data/*.gguf into tests/model/goldens/, with TINY_PROMPTS")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="with --generated: only these files (no .gguf)")
    ap.add_argument("--no-extra-bufts", action="store_true", help="no repacked weight buffers (AMX CPUs)")
    ap.add_argument("--cpu-repack", nargs="+", metavar="TYPE",
                    help="these weight types (q4_K ...) in llama.cpp's CPU_REPACK buffers, not AMX's")
    ap.add_argument("--n-predict", type=int, default=64)
    args = ap.parse_args()
    llama_cpp.llama_backend_init()
    if args.generated:
        models = sorted(glob.glob(os.path.join(ROOT, "tests/model/data/*.gguf")))
        if not models:
            raise SystemExit("no models in tests/model/data/ (run tools/gen_test_models.py)")
        for path in models:
            name = os.path.splitext(os.path.basename(path))[0]
            if args.only and name not in args.only:
                continue
            print(name)
            write(os.path.join(ROOT, "tests/model/goldens", name + ".json"),
                  goldens(path, TINY_PROMPTS, args.n_predict, not args.no_extra_bufts, args.cpu_repack))
    else:
        if not args.model or not args.out:
            ap.error("MODEL.gguf OUT.json, or --generated")
        write(args.out, goldens(args.model, PROMPTS, args.n_predict, not args.no_extra_bufts, args.cpu_repack))


if __name__ == "__main__":
    main()
