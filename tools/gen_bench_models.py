#!/usr/bin/env python3
"""A 1B-shaped Llama with random weights for speed benchmarks (models/bench/, not committed).

  .venv/bin/python tools/gen_bench_models.py [--out models/bench] [--force]

Writes llama-1b-f16.gguf (22 layers, n_embd 2048, 32 heads of 64, 4 KV heads, n_ff 5632: the
TinyLlama 1.1B shape; 1-D tensors F32; about 2.2 GB) with the 32000-token SPM vocabulary of
../shared/data/vocab/ggml-vocab-llama-spm.gguf (its tokenizer.* metadata copied), then quantizes
it with llama.cpp's own quantizer (llama-cpp-python, `scripts/setup.sh --oracle`) into
llama-1b-q4_k_m.gguf and llama-1b-q8_0.gguf. Tensors are generated and written one at a time, so
memory stays at about one tensor (under 0.5 GB). Files that exist are kept unless --force. The weights
are random (fixed seed): the outputs mean nothing, the speed is that of a real 1B model.

bench/bench_vs_llama_cpp.py --suite runs these with the demo model.
"""
import argparse
import ctypes
import os
import time

import gguf
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = os.path.join(ROOT, "..", "shared", "data", "vocab", "ggml-vocab-llama-spm.gguf")

N_LAYER = 22
N_EMBD = 2048
N_HEAD = 32
N_HEAD_KV = 4
N_FF = 5632
HEAD_DIM = N_EMBD // N_HEAD
N_CTX_TRAIN = 2048

QUANTS = [("q4_k_m", 15), ("q8_0", 7)]  # llama_ftype


def tensor_plan(n_vocab: int) -> list[tuple[str, tuple[int, ...], float]]:
    """(name, numpy shape = reversed ggml ne, std); std 0 = a norm weight (ones + noise, F32)."""
    kv = N_HEAD_KV * HEAD_DIM
    plan = [("token_embd.weight", (n_vocab, N_EMBD), 1.0)]
    for il in range(N_LAYER):
        p = f"blk.{il}."
        plan += [
            (p + "attn_norm.weight", (N_EMBD,), 0.0),
            (p + "attn_q.weight", (N_EMBD, N_EMBD), N_EMBD ** -0.5),
            (p + "attn_k.weight", (kv, N_EMBD), N_EMBD ** -0.5),
            (p + "attn_v.weight", (kv, N_EMBD), N_EMBD ** -0.5),
            (p + "attn_output.weight", (N_EMBD, N_EMBD), N_EMBD ** -0.5),
            (p + "ffn_norm.weight", (N_EMBD,), 0.0),
            (p + "ffn_gate.weight", (N_FF, N_EMBD), N_EMBD ** -0.5),
            (p + "ffn_up.weight", (N_FF, N_EMBD), N_EMBD ** -0.5),
            (p + "ffn_down.weight", (N_EMBD, N_FF), N_FF ** -0.5),
        ]
    plan += [("output_norm.weight", (N_EMBD,), 0.0), ("output.weight", (n_vocab, N_EMBD), 4.0 * N_EMBD ** -0.5)]
    return plan


def write_f16(path: str, seed: int = 1) -> None:
    vocab = gguf.GGUFReader(VOCAB)
    n_vocab = len(vocab.fields["tokenizer.ggml.tokens"].data)
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("bench-llama-1b-random")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_context_length(N_CTX_TRAIN)
    w.add_embedding_length(N_EMBD)
    w.add_feed_forward_length(N_FF)
    w.add_block_count(N_LAYER)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    for field in vocab.fields.values():
        if field.name.startswith("tokenizer."):
            vtype = field.types[0]
            sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            w.add_key_value(field.name, field.contents(), vtype, sub)
    plan = tensor_plan(n_vocab)
    for name, shape, std in plan:
        dtype = np.float32 if std == 0.0 else np.float16
        w.add_tensor_info(name, shape, np.dtype(dtype), int(np.prod(shape)) * np.dtype(dtype).itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for name, shape, std in plan:
        if std == 0.0:
            t = (1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
        else:
            t = (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float16)
        w.write_tensor_data(t)
        del t
    w.close()


def quantize(src: str, dst: str, ftype: int) -> None:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = 2
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({src} -> {dst}) returned {rc}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "models/bench"))
    ap.add_argument("--force", action="store_true", help="rewrite files that exist")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    f16 = os.path.join(args.out, "llama-1b-f16.gguf")
    todo = [(f16, None)] + [(os.path.join(args.out, f"llama-1b-{n}.gguf"), ft) for n, ft in QUANTS]
    for path, ftype in todo:
        if os.path.exists(path) and not args.force:
            print(f"{os.path.relpath(path, ROOT)}: exists, kept")
            continue
        t0 = time.time()
        tmp = path + ".part"  # an interrupted run leaves no file that looks complete
        if ftype is None:
            write_f16(tmp)
        else:
            quantize(f16, tmp, ftype)
        os.replace(tmp, path)
        print(f"{os.path.relpath(path, ROOT)}: {os.path.getsize(path) / 1e9:.2f} GB in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
