#!/usr/bin/env python3
"""Llamas with random weights for speed benchmarks (models/bench/, not committed).

  .venv/bin/python tools/gen_bench_models.py [--shape 1b|156m] [--out models/bench] [--force]

--shape 1b (the default) writes llama-1b-f16.gguf (22 layers, n_embd 2048, 32 heads of 64, 4 KV heads, n_ff 5632: the
TinyLlama 1.1B shape; 1-D tensors F32; about 2.2 GB) with the 32000-token SPM vocabulary of
tests/data/vocab/ggml-vocab-llama-spm.gguf (its tokenizer.* metadata copied), then quantizes
it with llama.cpp's own quantizer (llama-cpp-python, `scripts/setup.sh --oracle`) into
llama-1b-q4_k_m.gguf, llama-1b-q8_0.gguf, llama-1b-iq4_xs.gguf, llama-1b-q4_0.gguf,
llama-1b-q5_k_m.gguf and llama-1b-q6_k.gguf (issue 23's pp512 types). Tensors are generated and written one at a time, so
memory stays at about one tensor (under 0.5 GB). Files that exist are kept unless --force. The weights
are random (fixed seed): the outputs mean nothing, the speed is that of a real 1B model.

--shape 156m writes llama-156m-f16.gguf and llama-156m-q8_0.gguf: 16 layers, n_embd 768, 12 heads of
64, 2 KV heads, n_ff 2304, untied output; 156.1M parameters (158 MiB in Q8_0) and an f16 KV cache of
8 KiB per token (128 MiB at 16k), the model of issue 5's long-context benchmark.

bench/bench_vs_llama_cpp.py --suite runs the 1B files with the demo model;
bench/long_context_vs_llama_cpp.py runs the 156M one at 4k, 16k and 32k tokens.
"""
import argparse
import ctypes
import os
import time
from dataclasses import dataclass

import gguf
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = os.path.join(ROOT, "tests", "data", "vocab", "ggml-vocab-llama-spm.gguf")



@dataclass(frozen=True)
class Shape:
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_ctx_train: int
    quants: tuple[tuple[str, int], ...]  # (file suffix, llama_ftype)

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


SHAPES = {
    # the TinyLlama 1.1B shape
    "1b": Shape(n_layer=22, n_embd=2048, n_head=32, n_head_kv=4, n_ff=5632, n_ctx_train=2048,
                quants=(("q4_k_m", 15), ("q8_0", 7), ("iq4_xs", 30), ("q4_0", 2), ("q5_k_m", 17), ("q6_k", 18))),
    # issue 5's long-context model: 2 * 16 layers * 2 KV heads * 64 * 2 bytes = 8 KiB of f16 K/V per token
    "156m": Shape(n_layer=16, n_embd=768, n_head=12, n_head_kv=2, n_ff=2304, n_ctx_train=32768,
                  quants=(("q8_0", 7),)),
}


def tensor_plan(sh: Shape, n_vocab: int) -> list[tuple[str, tuple[int, ...], float]]:
    """(name, numpy shape = reversed ggml ne, std); std 0 = a norm weight (ones + noise, F32)."""
    N_EMBD, N_FF = sh.n_embd, sh.n_ff
    kv = sh.n_head_kv * sh.head_dim
    plan = [("token_embd.weight", (n_vocab, N_EMBD), 1.0)]
    for il in range(sh.n_layer):
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


def write_f16(path: str, name: str = "1b", seed: int = 1) -> None:
    sh = SHAPES[name]
    vocab = gguf.GGUFReader(VOCAB)
    n_vocab = len(vocab.fields["tokenizer.ggml.tokens"].data)
    w = gguf.GGUFWriter(path, "llama")
    w.add_name(f"bench-llama-{name}-random")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_context_length(sh.n_ctx_train)
    w.add_embedding_length(sh.n_embd)
    w.add_feed_forward_length(sh.n_ff)
    w.add_block_count(sh.n_layer)
    w.add_head_count(sh.n_head)
    w.add_head_count_kv(sh.n_head_kv)
    w.add_rope_dimension_count(sh.head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    for field in vocab.fields.values():
        if field.name.startswith("tokenizer."):
            vtype = field.types[0]
            sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            w.add_key_value(field.name, field.contents(), vtype, sub)
    plan = tensor_plan(sh, n_vocab)
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
    ap.add_argument("--shape", choices=sorted(SHAPES), default="1b",
                    help="1b: the TinyLlama 1.1B shape (default); 156m: issue 5's long-context model")
    ap.add_argument("--out", default=os.path.join(ROOT, "models/bench"))
    ap.add_argument("--force", action="store_true", help="rewrite files that exist")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    sh = SHAPES[args.shape]
    f16 = os.path.join(args.out, f"llama-{args.shape}-f16.gguf")
    todo = [(f16, None)] + [(os.path.join(args.out, f"llama-{args.shape}-{n}.gguf"), ft) for n, ft in sh.quants]
    for path, ftype in todo:
        if os.path.exists(path) and not args.force:
            print(f"{os.path.relpath(path, ROOT)}: exists, kept")
            continue
        t0 = time.time()
        tmp = path + ".part"  # an interrupted run leaves no file that looks complete
        if ftype is None:
            write_f16(tmp, args.shape)
        else:
            quantize(f16, tmp, ftype)
        os.replace(tmp, path)
        print(f"{os.path.relpath(path, ROOT)}: {os.path.getsize(path) / 1e9:.2f} GB in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
