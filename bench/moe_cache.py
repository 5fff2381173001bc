#!/usr/bin/env python3
"""The expert cache against every expert resident: fitllm's token generation speed on a generated
Qwen3-MoE file (random weights, not committed) with a budget of about half the file (--expert-cache
auto: the dense weights resident, the routed experts read from the file into slots on demand)
against a budget that holds it all.

  .venv/bin/python bench/moe_cache.py [--layers 10] [--skew [S]] [-n 32] [-r 2] [--budget-fraction 0.5]
  .venv/bin/python bench/moe_cache.py --layers 24 --experts 64 --used 8 --ff 256 --skew --generate-only

The file: n_embd 1024, 32 experts of 512 hidden units per layer, 4 used per token (Qwen3-30B-A3B's
proportions, smaller; --experts, --used, --ff change them), F16, --layers layers (10: about 1 GB),
under .cache/moe-bench/. Random router rows route about uniformly; --skew S (0.2 when given alone)
biases every layer toward a fifth of its experts, as real models' routing often is: each token
embedding gets a shared component along one random direction u, and the hot fifth's router rows
S x 1.5 (a random row's norm) along u, ramped to twice that at the last layer (u's share of the
hidden state shrinks with depth). Measured with S = 0.2: each layer's busiest fifth takes 79-81%
of the lookups on 10 layers (66-97% per layer), 78.5% on 24 layers of 64 experts (8 used);
uniform, 33-38% (few tokens). fitllm's expert cache line prints it ("routing: ...").
Each cached setting runs with --expert-evict lfu and lru (--evict: one of them), reading ahead
the experts the next layer's router would choose (--expert-prefetch on, the default) and not.
Prints one line per setting: tokens/s (fitllm bench's tg test, mean of -r runs), the hit rate, the
bytes read per token and the busiest fifth's share from fitllm's expert cache line, and the run's
peak pools. --generate-only writes the file and prints its path (for bench/memcap_vs_llama_cpp.py).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))

N_EMBD, N_HEAD, N_HEAD_KV, HEAD_DIM = 1024, 16, 4, 64
N_EXPERT, N_USED, N_FF_EXP = 32, 4, 512
DEFAULT_SKEW = 0.2


def generate(path: str, n_layer: int, skew: float, seed: int = 7, n_expert: int = N_EXPERT, n_used: int = N_USED,
             n_ff_exp: int = N_FF_EXP) -> None:
    """skew 0: uniform routing (random router rows). skew > 0: every token embedding gets a shared
    component along one random unit direction u (as large as its random part), and in each layer
    a fifth of the experts (a different random fifth per layer) get skew x 1.5 (the norm of a random
    router row) along u added to their router rows: a bias toward them that every token's hidden
    state carries, the same in fitllm and llama.cpp since it is in the weights."""
    import gguf
    import numpy as np
    from gen_test_models import bpe_vocab

    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, "qwen3moe")
    w.add_name("moe-bench")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_context_length(4096)
    w.add_embedding_length(N_EMBD)
    w.add_feed_forward_length(n_ff_exp * n_used)
    w.add_block_count(n_layer)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_expert_count(n_expert)
    w.add_expert_used_count(n_used)
    w.add_expert_feed_forward_length(n_ff_exp)
    w.add_rope_freq_base(1000000.0)
    w.add_layer_norm_rms_eps(1e-6)
    tokens, types, merges = bpe_vocab()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    eot = tokens.index("<|endoftext|>")
    w.add_bos_token_id(eot)
    w.add_eos_token_id(eot)
    w.add_add_bos_token(False)
    n_vocab = len(tokens)
    w.add_vocab_size(n_vocab)

    def mat(*shape: int, std: float) -> np.ndarray:  # numpy (rows, cols) = ggml ne (cols, rows)
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float16)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)

    # The skew's draws come from an rng of their own, so that the uniform file stays as it was.
    srng = np.random.default_rng(seed + 1000)
    u = srng.standard_normal(N_EMBD).astype(np.float32)
    u /= np.linalg.norm(u)
    embd = mat(n_vocab, N_EMBD, std=0.5)
    if skew:  # a shared component as large as the random part (norm 0.5 sqrt(n_embd))
        embd = (embd.astype(np.float32) + np.float32(0.5 * np.sqrt(N_EMBD)) * u[None, :]).astype(np.float16)
    w.add_tensor("token_embd.weight", embd)
    q_dim, kv_dim = N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM
    for il in range(n_layer):
        p = f"blk.{il}."
        w.add_tensor(p + "attn_norm.weight", norm(N_EMBD))
        w.add_tensor(p + "attn_q.weight", mat(q_dim, N_EMBD, std=1.5 / np.sqrt(N_EMBD)))
        w.add_tensor(p + "attn_k.weight", mat(kv_dim, N_EMBD, std=1.5 / np.sqrt(N_EMBD)))
        w.add_tensor(p + "attn_v.weight", mat(kv_dim, N_EMBD, std=1.0 / np.sqrt(N_EMBD)))
        w.add_tensor(p + "attn_q_norm.weight", (1.5 * norm(HEAD_DIM)).astype(np.float32))
        w.add_tensor(p + "attn_k_norm.weight", (1.5 * norm(HEAD_DIM)).astype(np.float32))
        w.add_tensor(p + "attn_output.weight", mat(N_EMBD, q_dim, std=1.0 / np.sqrt(q_dim)))
        w.add_tensor(p + "ffn_norm.weight", norm(N_EMBD))
        router = rng.standard_normal((n_expert, N_EMBD), dtype=np.float32) * np.float32(1.5 / np.sqrt(N_EMBD))
        if skew:  # this layer's hot fifth: a bias along u, which every token's hidden state has
            hot = srng.permutation(n_expert)[: max(1, n_expert // 5)]
            ramp = 1.0 + il / max(1, n_layer - 1)  # twice at the last layer: u's share of h shrinks with depth
            router[hot] += np.float32(skew * 1.5 * ramp) * u[None, :]
        w.add_tensor(p + "ffn_gate_inp.weight", router)
        w.add_tensor(p + "ffn_gate_exps.weight", mat(n_expert, n_ff_exp, N_EMBD, std=1.0 / np.sqrt(N_EMBD)))
        w.add_tensor(p + "ffn_up_exps.weight", mat(n_expert, n_ff_exp, N_EMBD, std=1.0 / np.sqrt(N_EMBD)))
        w.add_tensor(p + "ffn_down_exps.weight", mat(n_expert, N_EMBD, n_ff_exp, std=2.0 / np.sqrt(n_ff_exp)))
    w.add_tensor("output_norm.weight", (4.0 / (0.5 * np.sqrt(N_EMBD)) * rng.standard_normal(N_EMBD)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def run_bench(fitllm: str, model: str, mem: int, expert_cache: str, prefetch: str, n_gen: int, reps: int,
              threads: int, evict: str | None = None) -> dict:
    cmd = [fitllm, "bench", "-m", model, "-p", "0", "-n", str(n_gen), "-r", str(reps), "-o", "json",
           "-t", str(threads), "--mem", str(mem), "--expert-cache", expert_cache, "--expert-prefetch", prefetch] \
        + (["--expert-evict", evict] if evict else [])
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: exit {r.returncode}\n{r.stderr}")
    rows = json.loads(r.stdout)
    tg = next(row for row in rows if str(row.get("test", "")).startswith("tg"))
    out = {"tok_s": tg.get("avg_ts"), "stddev": tg.get("stddev_ts"), "stderr": r.stderr.strip().splitlines()[-1]}
    m = re.search(r"expert cache: (\d+) slots, (\d+) hits, (\d+) misses \(hit rate ([0-9.]+)%\), ([^,]+) read, "
                  r"([^ ]+ [^ ]+) per token", r.stderr)
    if m:
        out.update(slots=int(m.group(1)), hit_rate=float(m.group(4)), read=m.group(5), per_token=m.group(6))
    m = re.search(r"busiest fifth of experts took ([0-9.]+)%", r.stderr)
    if m:
        out["top_fifth"] = float(m.group(1))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=10, help="layers (10: about 1 GB)")
    ap.add_argument("--skew", type=float, nargs="?", const=DEFAULT_SKEW, default=0.0,
                    help=f"router bias toward a fifth of the experts (default {DEFAULT_SKEW} when given without a value)")
    ap.add_argument("--experts", type=int, default=N_EXPERT, help="routed experts per layer")
    ap.add_argument("--used", type=int, default=N_USED, help="experts used per token")
    ap.add_argument("--ff", type=int, default=N_FF_EXP, help="hidden units per expert")
    ap.add_argument("--generate-only", action="store_true", help="write the file (if missing), print its path, stop")
    ap.add_argument("--evict", default=None, help="only this --expert-evict for the cached runs (default: lfu and lru)")
    ap.add_argument("-n", type=int, default=32, help="tokens generated per run")
    ap.add_argument("-r", type=int, default=2, help="runs per setting")
    ap.add_argument("-t", type=int, default=2, help="threads")
    ap.add_argument("--budget-fraction", type=float, default=0.5, help="the cached run's --mem, of the file size")
    ap.add_argument("--fitllm", default=os.path.join(ROOT, "build/fitllm"))
    args = ap.parse_args()

    out_dir = os.path.join(ROOT, ".cache/moe-bench")
    os.makedirs(out_dir, exist_ok=True)
    shape = "" if (args.experts, args.used, args.ff) == (N_EXPERT, N_USED, N_FF_EXP) else \
        f"-{args.experts}x{args.used}x{args.ff}"
    model = os.path.join(out_dir, f"moe-{args.layers}l{shape}{f'-ramp{args.skew:g}' if args.skew else ''}.gguf")
    if not os.path.exists(model):
        print(f"generating {model} ...", file=sys.stderr)
        generate(model + ".tmp", args.layers, args.skew, n_expert=args.experts, n_used=args.used, n_ff_exp=args.ff)
        os.replace(model + ".tmp", model)
    if args.generate_only:
        print(model)
        return
    size = os.path.getsize(model)
    print(f"model {model}: {size / 2**20:.0f} MiB, {args.layers} layers x {args.experts} experts "
          f"({args.used} used){f', router bias {args.skew:g} toward a fifth' if args.skew else ''}")
    small = int(size * args.budget_fraction)
    settings = [("resident", size * 2 + (256 << 20), "off", "on", None)]
    for evict in ([args.evict] if args.evict else ["lfu", "lru"]):
        settings += [(f"expert cache ({evict}), --mem {small / 2**20:.0f} MiB", small, "auto", "on", evict),
                     ("  the same without read-ahead", small, "auto", "off", evict)]
    for label, mem, cache, prefetch, evict in settings:
        r = run_bench(args.fitllm, model, mem, cache, prefetch, args.n, args.r, args.t, evict)
        extra = (f" | {r['slots']} slots, hit rate {r['hit_rate']:.1f}%, {r['per_token']} read per token, "
                 f"busiest fifth {r.get('top_fifth', 0):.1f}% of lookups" if "slots" in r else "")
        print(f"{label:40s} tg {r['tok_s']:.2f} +- {r['stddev']:.2f} tok/s{extra}")
        print(f"    {r['stderr']}")


if __name__ == "__main__":
    main()
