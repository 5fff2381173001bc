#!/usr/bin/env python3
"""An 8B-shaped Llama in Q4_K_M's tensor types with random weights, for GPU speed benchmarks.

  python3 tools/gen_q4km_bench_model.py OUT.gguf [--layers 32] [--force]

The Llama 3 8B shape (32 layers, n_embd 4096, 32 heads of 128, 8 KV heads, n_ff 14336, 128256 tokens)
with llama.cpp's Q4_K_M type choice (Q6_K for output.weight and for attn_v / ffn_down of the layers
llama.cpp gives more bits: the first and last eighth and every third in between; Q4_K elsewhere; norms
F32). The blocks are random bytes with small fixed fp16 scales, written straight into the file: no f16
model first and no quantizer, so it needs only numpy (no gguf, no llama-cpp-python) and takes seconds
per GB, which a GPU session with minutes to spend needs. The weights mean nothing (the speed is that
of a real model of this shape and types); the vocabulary is synthetic (SPM: <unk>, <s>, </s>, the 256
byte tokens, then '▁w<i>'), enough for `fitllm bench`, which feeds random token ids.
--layers N writes fewer layers of the same shape (a quick check that the file loads).
"""
import argparse
import os
import struct
import sys
import time

import numpy as np

N_EMBD, N_HEAD, N_HEAD_KV, N_FF, N_VOCAB = 4096, 32, 8, 14336, 128256
HEAD_DIM = N_EMBD // N_HEAD
ALIGN = 32

F32, Q4_K, Q6_K = 0, 12, 14
BLOCK = {Q4_K: (256, 144), Q6_K: (256, 210)}  # elements, bytes

# GGUF value types
U32, I32, F32V, BOOL, STR, ARR = 4, 5, 6, 7, 8, 9


def s(x: str) -> bytes:
    b = x.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key: str, vtype: int, value) -> bytes:
    out = s(key) + struct.pack("<I", vtype)
    if vtype == U32:
        return out + struct.pack("<I", value)
    if vtype == F32V:
        return out + struct.pack("<f", value)
    if vtype == BOOL:
        return out + struct.pack("<?", value)
    if vtype == STR:
        return out + s(value)
    raise ValueError(vtype)


def kv_array(key: str, etype: int, values) -> bytes:
    out = s(key) + struct.pack("<IIQ", ARR, etype, len(values))
    if etype == STR:
        return out + b"".join(s(v) for v in values)
    if etype == F32V:
        return out + np.asarray(values, dtype="<f4").tobytes()
    if etype == I32:
        return out + np.asarray(values, dtype="<i4").tobytes()
    raise ValueError(etype)


def more_bits(il: int, n_layer: int) -> bool:
    # llama.cpp's use_more_bits(i, n): the first and last eighth, and every third layer between.
    return il < n_layer // 8 or il >= 7 * n_layer // 8 or (il - n_layer // 8) % 3 == 2


def tensor_plan(n_layer: int):
    """(name, ggml ne (cols first), type)."""
    kv_dim = N_HEAD_KV * HEAD_DIM
    plan = [("token_embd.weight", (N_EMBD, N_VOCAB), Q4_K)]
    for il in range(n_layer):
        p = f"blk.{il}."
        big = Q6_K if more_bits(il, n_layer) else Q4_K
        plan += [
            (p + "attn_norm.weight", (N_EMBD,), F32),
            (p + "attn_q.weight", (N_EMBD, N_EMBD), Q4_K),
            (p + "attn_k.weight", (N_EMBD, kv_dim), Q4_K),
            (p + "attn_v.weight", (N_EMBD, kv_dim), big),
            (p + "attn_output.weight", (N_EMBD, N_EMBD), Q4_K),
            (p + "ffn_norm.weight", (N_EMBD,), F32),
            (p + "ffn_gate.weight", (N_EMBD, N_FF), Q4_K),
            (p + "ffn_up.weight", (N_EMBD, N_FF), Q4_K),
            (p + "ffn_down.weight", (N_FF, N_EMBD), big),
        ]
    plan += [("output_norm.weight", (N_EMBD,), F32), ("output.weight", (N_EMBD, N_VOCAB), Q6_K)]
    return plan


def nbytes(ne, ttype: int) -> int:
    n = int(np.prod(ne))
    if ttype == F32:
        return 4 * n
    elems, size = BLOCK[ttype]
    return n // elems * size


def tensor_data(ne, ttype: int, rng) -> bytes:
    if ttype == F32:
        return (1.0 + 0.1 * rng.standard_normal(int(np.prod(ne)), dtype=np.float32)).astype("<f4").tobytes()
    elems, size = BLOCK[ttype]
    n_blocks = int(np.prod(ne)) // elems
    blocks = np.frombuffer(bytearray(rng.bytes(n_blocks * size)), dtype=np.uint8).reshape(n_blocks, size)
    if ttype == Q4_K:  # d, dmin first: x = d * sc * q - dmin * m with sc, m < 64, q < 16
        blocks[:, 0:2] = np.frombuffer(np.float16(2e-3).tobytes(), np.uint8)
        blocks[:, 2:4] = np.frombuffer(np.float16(1e-3).tobytes(), np.uint8)
    else:  # Q6_K: d last: x = d * scale * (q - 32), scale int8
        blocks[:, 208:210] = np.frombuffer(np.float16(1e-4).tobytes(), np.uint8)
    return blocks.tobytes()


def metadata(n_layer: int) -> list[bytes]:
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    tokens += [f"\u2581w{i}" for i in range(N_VOCAB - len(tokens))]
    types += [1] * (N_VOCAB - len(types))
    scores = [0.0] * 259 + [-float(i) for i in range(N_VOCAB - 259)]
    return [
        kv("general.architecture", STR, "llama"),
        kv("general.name", STR, f"bench-llama-8b-q4_k_m-random-{n_layer}l"),
        kv("general.file_type", U32, 15),  # MOSTLY_Q4_K_M
        kv("general.alignment", U32, ALIGN),
        kv("llama.context_length", U32, 8192),
        kv("llama.embedding_length", U32, N_EMBD),
        kv("llama.feed_forward_length", U32, N_FF),
        kv("llama.block_count", U32, n_layer),
        kv("llama.attention.head_count", U32, N_HEAD),
        kv("llama.attention.head_count_kv", U32, N_HEAD_KV),
        kv("llama.rope.dimension_count", U32, HEAD_DIM),
        kv("llama.rope.freq_base", F32V, 500000.0),
        kv("llama.attention.layer_norm_rms_epsilon", F32V, 1e-5),
        kv("llama.vocab_size", U32, N_VOCAB),
        kv("tokenizer.ggml.model", STR, "llama"),
        kv_array("tokenizer.ggml.tokens", STR, tokens),
        kv_array("tokenizer.ggml.scores", F32V, scores),
        kv_array("tokenizer.ggml.token_type", I32, types),
        kv("tokenizer.ggml.bos_token_id", U32, 1),
        kv("tokenizer.ggml.eos_token_id", U32, 2),
        kv("tokenizer.ggml.unknown_token_id", U32, 0),
    ]


def write(path: str, n_layer: int, seed: int = 1) -> None:
    plan = tensor_plan(n_layer)
    kvs = metadata(n_layer)
    infos, offset = [], 0
    for name, ne, ttype in plan:
        infos.append(s(name) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne) +
                     struct.pack("<IQ", ttype, offset))
        offset += (nbytes(ne, ttype) + ALIGN - 1) // ALIGN * ALIGN
    rng = np.random.default_rng(seed)
    with open(path, "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, len(plan), len(kvs)))
        for b in kvs + infos:
            f.write(b)
        f.write(b"\0" * (-f.tell() % ALIGN))
        for name, ne, ttype in plan:
            data = tensor_data(ne, ttype, rng)
            assert len(data) == nbytes(ne, ttype), name
            f.write(data)
            f.write(b"\0" * (-len(data) % ALIGN))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--force", action="store_true", help="rewrite the file when it exists")
    args = ap.parse_args()
    if os.path.exists(args.out) and not args.force:
        print(f"{args.out}: exists, kept")
        return
    t0 = time.time()
    tmp = args.out + ".part"  # an interrupted run leaves no file that looks complete
    write(tmp, args.layers)
    os.replace(tmp, args.out)
    print(f"{args.out}: {os.path.getsize(args.out) / 1e9:.2f} GB in {time.time() - t0:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
