#!/usr/bin/env python3
"""Small random-weight GGUF models for fitllm's forward-pass tests (tests/model/data/).

  .venv/bin/python tools/gen_test_models.py [--out tests/model/data] [--arch qwen3 ...]

Writes, for each architecture,

  tiny-llama-*.gguf   llama: SPM vocabulary, untied output.weight, GQA (4 heads, 2 KV heads)
  tiny-qwen2-*.gguf   qwen2: byte-level BPE vocabulary (pre "qwen2"), Q/K/V biases, tied
                      embeddings (no output.weight)
  tiny-qwen3-*.gguf   qwen3: qwen2's vocabulary and tied embeddings, no biases, RMS norms on each
                      head of Q and K, and a head size of 128 (not n_embd / n_head, as Qwen3's own)
  tiny-gemma2-*.gguf  gemma2: llama's SPM vocabulary, tied embeddings, post-attention and post-FFN
                      norms, layer 0 sliding-window (window 32) and layer 1 global, attention
                      scores capped at 4 and logits at 8 (Gemma 2's own 50 and 30 would not bite
                      on these small random weights); in F16, Q8_0 and Q4_K_M only
  tiny-phi3-*.gguf    phi3: llama's SPM vocabulary, untied output.weight, fused attn_qkv and fused
                      gate-up ffn_up (2 n_ff rows), sliding_window 2047 declared (llama.cpp ignores
                      it for Phi); in F16, Q8_0 and Q4_K_M
  tiny-phi3-longrope-*.gguf  phi3 with separate Q/K/V, partial rotary (48 of 64 dims) and
                      LongRoPE: rope_factors_long / _short over an original context of 32, so any
                      context of the tests (> 32) rotates with the long factors, and the
                      converter's attn_factor sqrt(1 + ln(2048 / 32) / ln(32)); in F16 and Q8_0
  tiny-qwen3moe-*.gguf qwen3moe: qwen3 with head size 64 and, for each FFN, 8 experts of 32 hidden
                      units, 2 used per token (an F32 router, as converted Qwen3-MoE files have);
                      in F16, Q8_0 and Q4_K_M only (the experts' down matrices, rows of 32, fall
                      back from K-quants to what llama.cpp picks for them)
  tiny-granite-*.gguf granite: llama with Granite's multipliers (embeddings x 2, block outputs x
                      0.5 before the residual add, attention scale 0.2, logits / 4); F16, Q8_0, Q4_K_M
  tiny-smollm3-*.gguf smollm3: llama with 4 layers, the fourth without RoPE (SmolLM3's NoPE layers);
                      F16, Q8_0, Q4_K_M
  tiny-mistral3-*.gguf mistral3: llama's SPM vocabulary, untied output, YaRN (factor 4 over an
                      original context of 64, yarn_log_multiplier 1) and the Llama-4 attention
                      temperature (Q times 1 + 0.5 ln(floor(pos / 64) + 1)); F16, Q8_0, Q4_K_M
  tiny-olmo2-*.gguf   olmo2: llama's SPM vocabulary, untied output, no pre-norms but post-attention
                      and post-FFN norms, Q and K RMS-normed over all heads, NeoX rotation; F16,
                      Q8_0, Q4_K_M
  tiny-mixtral-*.gguf mixtral: a "llama" file (llama's vocabulary, untied output) with expert_count 8,
                      expert_used_count 2 and, for each FFN, 8 experts feed_forward_length 32 wide
                      (an F32 router); F16, Q8_0, Q4_K_M
  tiny-qwen2moe-*.gguf qwen2moe: qwen2's vocabulary and Q/K/V biases, untied output, 8 experts of 32
                      hidden units (2 used, their weights not normalized) and a shared expert of 256
                      (expert_shared_feed_forward_length; feed_forward_length 128 is neither) gated
                      by sigmoid(ffn_gate_inp_shexp . h); F16, Q8_0, Q4_K_M
  tiny-gpt-oss-*.gguf gpt-oss: byte-level BPE vocabulary (pre "gpt-4o") with gpt-oss's harmony
                      special tokens and chat template, untied output, layer 0 sliding-window
                      (window 16) and layer 1 global, 8 heads of 64 (n_head * head_dim = 2 n_embd) over 2 KV
                      heads, Q/K/V/output biases, attention sinks (one logit per head, mean 1.5),
                      YaRN (factor 4 over an original context of 64), the FFN norm under
                      post_attention_norm, and 8 experts of 32 hidden units, 2 used, with a router
                      bias and per-expert gate/up/down biases (gpt-oss's top-k-then-softmax routing
                      and clamped SwiGLU); F16, Q8_0 and MXFP4_MOE (llama.cpp's quantizer: MXFP4
                      experts, Q8_0 for the rest)

first in F16 (1-D tensors F32) with gguf-py from a fixed seed, then quantized by llama.cpp's own
quantizer (llama-cpp-python's llama_model_quantize, `scripts/setup.sh --oracle`) into Q8_0, Q6_K,
Q5_K_M, Q4_K_M, Q4_0 and Q2_K; the llama model also into IQ4_XS: 22 files. Shapes: n_embd 256 (K-quant rows are multiples of 256),
n_ff 256, 2 layers, head size 64, a vocabulary of a few hundred tokens. The embedding / output
scales give logits with a standard deviation of about 4, so greedy decoding is seldom a coin toss
between near-ties. Deterministic: the same numpy and llama.cpp give the same bytes.

The goldens for these files come from tools/gen_model_goldens.py --generated.
"""
import argparse
import ctypes
import os
import re
from collections import Counter

import gguf
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

N_EMBD = 256
N_FF = 256
N_LAYER = 2
N_HEAD = 4
N_HEAD_KV = 2
HEAD_DIM = N_EMBD // N_HEAD
HEAD_DIM_QWEN3 = 128  # Qwen3's head size, with n_head * head_dim = 2 n_embd here
N_CTX_TRAIN = 2048
N_MERGES = 96
LOGIT_STD = 4.0  # std of the final logits for a unit-RMS hidden state

# (name, llama_ftype) of the quantized variants; the F16 file is the source of all of them.
QUANTS = [("q8_0", 7), ("q6_k", 18), ("q5_k_m", 17), ("q4_k_m", 15), ("q4_0", 2), ("q2_k", 10)]
# Types one architecture is enough for: the weight types beyond those (they need no importance matrix).
EXTRA_QUANTS = {"llama": [("iq4_xs", 30)]}
# (name, architecture, seed, the quantized types): qwen3-yarn is qwen3 with YaRN scaling (factor 4
# over an original context of 64, so that the ramp spans pairs 0 .. 11 of 64), in F16 and Q8_0.
MODELS = [("llama", "llama", 1, QUANTS + EXTRA_QUANTS["llama"]), ("qwen2", "qwen2", 2, QUANTS),
          ("qwen3", "qwen3", 3, QUANTS), ("qwen3-yarn", "qwen3", 4, [("q8_0", 7)]),
          ("gemma2", "gemma2", 5, [("q8_0", 7), ("q4_k_m", 15)]),
          ("qwen3moe", "qwen3moe", 6, [("q8_0", 7), ("q4_k_m", 15)]),
          ("phi3", "phi3", 7, [("q8_0", 7), ("q4_k_m", 15)]), ("phi3-longrope", "phi3", 8, [("q8_0", 7)]),
          ("granite", "granite", 9, [("q8_0", 7), ("q4_k_m", 15)]),
          ("olmo2", "olmo2", 10, [("q8_0", 7), ("q4_k_m", 15)]),
          ("smollm3", "smollm3", 11, [("q8_0", 7), ("q4_k_m", 15)]),
          ("mistral3", "mistral3", 12, [("q8_0", 7), ("q4_k_m", 15)]),
          ("mixtral", "llama", 13, [("q8_0", 7), ("q4_k_m", 15)]),
          ("qwen2moe", "qwen2moe", 14, [("q8_0", 7), ("q4_k_m", 15)]),
          ("gpt-oss", "gpt-oss", 15, [("q8_0", 7), ("mxfp4_moe", 38)])]
ARCHS = [m[0] for m in MODELS]
YARN_FACTOR, YARN_ORIG_CTX = 4.0, 64
# gemma2: the sliding window of its even layers and the two soft-capping values, small enough that
# a wrong window or a missing cap moves the logits well past the tests' tolerances.
GEMMA2_WINDOW, GEMMA2_ATTN_CAP, GEMMA2_FINAL_CAP = 32, 4.0, 8.0
# qwen3moe and mixtral: experts per layer, used per token, hidden units per expert (files under 2 MB).
MOE_N_EXPERT, MOE_N_USED, MOE_N_FF = 8, 2, 32
# qwen2moe: feed_forward_length (which llama.cpp falls back to for the shared expert's width, so a
# reader that ignores expert_shared_feed_forward_length fails on the tensors' shapes) and the shared
# expert's hidden units.
QWEN2MOE_N_FF, QWEN2MOE_N_FF_SHEXP = 128, 256
# gpt-oss: query heads (of HEAD_DIM: 2 n_embd wide, as gpt-oss's own 64 x 64 against 2880), layers,
# the sliding window of the even layers, the mean and spread of the sinks, and the SwiGLU-OAI clamp
# that gate and up should reach now and then (gpt-oss's limit is 7).
GPT_OSS_N_HEAD, GPT_OSS_N_LAYER, GPT_OSS_WINDOW = 8, 2, 16
GPT_OSS_SINK_MEAN, GPT_OSS_SINK_STD = 1.5, 1.5
# gpt-oss's harmony chat format's special tokens (its chat template writes them).
GPT_OSS_SPECIALS = ["<|start|>", "<|message|>", "<|end|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>"]
# phi3-longrope: the original context (long factors beyond it) and the rotated dims per head.
PHI3_ORIG_CTX, PHI3_N_ROT = 32, 48
# granite: its four multipliers (Granite 3's own are 12, 0.22, 1/128 and 8; these keep a unit-size
# residual stream on these random weights while each one still moves the logits).
GRANITE_EMBEDDING_SCALE, GRANITE_RESIDUAL_SCALE, GRANITE_ATTENTION_SCALE, GRANITE_LOGIT_SCALE = 2.0, 0.5, 0.2, 4.0
# mistral3: the attention temperature's beta (Ministral 3's is 0.1; 0.5 moves the logits more) and
# yarn_log_multiplier (Ministral 3's mscale_all_dim); YaRN as qwen3-yarn's, so that the temperature
# steps every 64 positions over the goldens' prompts.
MISTRAL3_TEMP_SCALE, MISTRAL3_YARN_LOG_MUL = 0.5, 1.0

# Text the vocabularies' merges are learned from (a naive BPE over whitespace-split words).
CORPUS = """
Once upon a time there was a little model that wanted to predict the next token. It read the
text one piece at a time and tried to guess what would come after. The quick brown fox jumps
over the lazy dog. In the beginning the model was random, and its guesses were random too, but
the tests did not mind: they only asked that two programs agree on every number they printed.
def fibonacci(n): return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)
The weather is nice today and the sea is calm; the children play on the sand by the water.
1, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 610, 987.
"""


def learn_merges(words: list[str], n_merges: int) -> list[tuple[str, str]]:
    """Classic BPE training on symbol sequences (deterministic: ties broken by the pair itself)."""
    seqs = Counter(tuple(w) for w in words)
    merges = []
    for _ in range(n_merges):
        pairs = Counter()
        for seq, n in seqs.items():
            for a, b in zip(seq, seq[1:]):
                pairs[(a, b)] += n
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        merges.append(best)
        new = Counter()
        for seq, n in seqs.items():
            out, i = [], 0
            while i < len(seq):
                if i + 1 < len(seq) and (seq[i], seq[i + 1]) == best:
                    out.append(seq[i] + seq[i + 1])
                    i += 2
                else:
                    out.append(seq[i])
                    i += 1
            new[tuple(out)] += n
        seqs = new
    return merges


def spm_vocab() -> tuple[list[str], list[float], list[int]]:
    """<unk>, <s>, </s>, the 256 byte tokens, then every printable ASCII character and the learned
    pieces, with SPM scores (higher merges first)."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    scores = [0.0, 0.0, 0.0] + [0.0] * 256
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + [gguf.TokenType.BYTE] * 256
    pieces = ["\u2581"] + [chr(c) for c in range(33, 127)]
    words = ["\u2581" + w for w in CORPUS.split()]
    for a, b in learn_merges(words, N_MERGES):
        if a + b not in pieces:
            pieces.append(a + b)
    for i, p in enumerate(pieces):
        tokens.append(p)
        scores.append(-float(i))
        types.append(gguf.TokenType.NORMAL)
    return tokens, scores, [int(t) for t in types]


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (byte-level BPE)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def bpe_vocab() -> tuple[list[str], list[int], list[str]]:
    """The 256 byte-level symbols in byte order, the learned merges' tokens, then Qwen2's special
    tokens."""
    b2u = bytes_to_unicode()
    tokens = [b2u[b] for b in range(256)]
    words = [("".join(b2u[c] for c in (" " + w).encode())) for w in re.findall(r"\S+", CORPUS)]
    merges = learn_merges(words, N_MERGES)
    for a, b in merges:
        if a + b not in tokens:
            tokens.append(a + b)
    types = [int(gguf.TokenType.NORMAL)] * len(tokens)
    for special in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]:
        tokens.append(special)
        types.append(int(gguf.TokenType.CONTROL))
    return tokens, types, [f"{a} {b}" for a, b in merges]


def write_f16(arch: str, path: str, seed: int, yarn: bool = False, longrope: bool = False, moe: bool = False) -> None:
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, arch)
    w.add_name(f"tiny-{arch}")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_context_length(N_CTX_TRAIN)
    w.add_embedding_length(N_EMBD)
    # mixtral: each expert's width; qwen2moe: a width neither of its FFNs has
    w.add_feed_forward_length(MOE_N_FF if moe else QWEN2MOE_N_FF if arch == "qwen2moe" else N_FF)
    n_layer = 4 if arch == "smollm3" else GPT_OSS_N_LAYER if arch == "gpt-oss" else N_LAYER  # smollm3: its fourth layer has no RoPE
    n_head = GPT_OSS_N_HEAD if arch == "gpt-oss" else N_HEAD
    w.add_block_count(n_layer)
    w.add_head_count(n_head)
    w.add_head_count_kv(N_HEAD_KV)
    head_dim = HEAD_DIM_QWEN3 if arch == "qwen3" else HEAD_DIM
    w.add_rope_dimension_count(PHI3_N_ROT if longrope else head_dim)
    if arch in ("qwen3", "qwen3moe", "gpt-oss"):
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if arch == "gpt-oss":  # as convert_hf_to_gguf's GptOssModel writes them
        w.add_expert_count(MOE_N_EXPERT)
        w.add_expert_used_count(MOE_N_USED)
        w.add_expert_feed_forward_length(MOE_N_FF)
        w.add_sliding_window(GPT_OSS_WINDOW)
    if arch == "qwen3moe":
        w.add_expert_count(MOE_N_EXPERT)
        w.add_expert_used_count(MOE_N_USED)
        w.add_expert_feed_forward_length(MOE_N_FF)
    if arch == "qwen2moe":
        w.add_expert_count(MOE_N_EXPERT)
        w.add_expert_used_count(MOE_N_USED)
        w.add_expert_feed_forward_length(MOE_N_FF)
        w.add_expert_shared_feed_forward_length(QWEN2MOE_N_FF_SHEXP)
    if moe:  # mixtral: llama with experts
        w.add_expert_count(MOE_N_EXPERT)
        w.add_expert_used_count(MOE_N_USED)
    if arch in ("llama", "gemma2", "phi3", "granite", "olmo2", "smollm3", "mistral3"):
        w.add_rope_freq_base(10000.0)
        if arch == "mistral3":
            w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
            w.add_rope_scaling_factor(YARN_FACTOR)
            w.add_rope_scaling_orig_ctx_len(YARN_ORIG_CTX)
            w.add_rope_scaling_yarn_log_mul(MISTRAL3_YARN_LOG_MUL)
            w.add_attn_temperature_scale(MISTRAL3_TEMP_SCALE)
        w.add_layer_norm_rms_eps(1e-6 if arch == "gemma2" else 1e-5)
        tokens, scores, types = spm_vocab()
        if arch == "phi3":  # llama.cpp needs <|endoftext|> in a Phi-3 vocabulary (it sets RSTRIP on specials)
            for special in ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|user|>", "<|assistant|>", "<|end|>"]:
                tokens.append(special)
                scores.append(0.0)
                types.append(int(gguf.TokenType.CONTROL))
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_unk_token_id(0)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_add_bos_token(True)
        w.add_add_eos_token(False)
    else:
        w.add_rope_freq_base(150000.0 if arch == "gpt-oss" else 1000000.0)
        if yarn or arch == "gpt-oss":
            w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
            w.add_rope_scaling_factor(YARN_FACTOR)
            w.add_rope_scaling_orig_ctx_len(YARN_ORIG_CTX)
        w.add_layer_norm_rms_eps(1e-5 if arch == "gpt-oss" else 1e-6)
        tokens, types, merges = bpe_vocab()
        if arch == "gpt-oss":  # harmony's special tokens, and OpenAI's chat template (a fixture of tests/chat)
            for special in GPT_OSS_SPECIALS:
                tokens.append(special)
                types.append(int(gguf.TokenType.CONTROL))
            with open(os.path.join(ROOT, "tests/chat/fixtures/gpt-oss/openai-gpt-oss.jinja"), encoding="utf-8") as f:
                w.add_chat_template(f.read())
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("gpt-4o" if arch == "gpt-oss" else "qwen2")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        eot = tokens.index("<|endoftext|>")
        w.add_bos_token_id(eot)
        w.add_eos_token_id(eot)
        w.add_pad_token_id(eot)
        w.add_add_bos_token(False)
    if arch == "phi3":
        w.add_sliding_window(2047)  # Phi-3-mini-4k's; llama.cpp disables Phi's window
        if longrope:
            w.add_rope_scaling_orig_ctx_len(PHI3_ORIG_CTX)
            w.add_rope_scaling_attn_factors(float(np.sqrt(1 + np.log(N_CTX_TRAIN / PHI3_ORIG_CTX) / np.log(PHI3_ORIG_CTX))))
    if arch == "granite":
        w.add_embedding_scale(GRANITE_EMBEDDING_SCALE)
        w.add_residual_scale(GRANITE_RESIDUAL_SCALE)
        w.add_attention_scale(GRANITE_ATTENTION_SCALE)
        w.add_logit_scale(GRANITE_LOGIT_SCALE)
    if arch == "gemma2":
        w.add_sliding_window(GEMMA2_WINDOW)
        w.add_attn_logit_softcapping(GEMMA2_ATTN_CAP)
        w.add_final_logit_softcapping(GEMMA2_FINAL_CAP)
    n_vocab = len(tokens)
    w.add_vocab_size(n_vocab)

    def mat(rows: int, cols: int, std: float) -> np.ndarray:  # numpy shape (rows, cols) = ggml ne (cols, rows)
        return (rng.standard_normal((rows, cols), dtype=np.float32) * std).astype(np.float16)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)

    tied = arch not in ("llama", "phi3", "granite", "olmo2", "smollm3", "mistral3", "qwen2moe", "gpt-oss")
    # Untied (llama): unit-scale embeddings; output.weight alone sets the logits' spread. Tied
    # (qwen2): the embedding is also the output matrix. Its scale against the layers' outputs (of
    # about unit size) decides between two degenerate random models: large, and every token
    # predicts itself (e_t . e_t dominates its logit); small, and the residual stream forgets the
    # token and greedy decoding falls into a fixed point. Half-scale embeddings with a zero-mean
    # output_norm.weight (which cancels the self term in expectation) keep continuations varied.
    # gemma2 scales the embedding by sqrt(n_embd) on the way in: the same input size as qwen2's.
    emb_std = (0.5 / np.sqrt(N_EMBD) if arch == "gemma2" else 0.5) if tied else 1.0
    if arch == "granite":  # times GRANITE_EMBEDDING_SCALE on the way in: unit size
        emb_std = 1.0 / GRANITE_EMBEDDING_SCALE
    w.add_tensor("token_embd.weight", mat(n_vocab, N_EMBD, emb_std))
    if longrope:  # LongRoPE's per-pair divisors: near 1 for the short context, growing to 16 for the long
        ramp = np.linspace(0.0, 1.0, PHI3_N_ROT // 2, dtype=np.float32)
        w.add_tensor("rope_factors_long.weight", (1.0 + 15.0 * ramp**2).astype(np.float32))
        w.add_tensor("rope_factors_short.weight", (1.0 + 0.5 * ramp).astype(np.float32))
    kv_dim = N_HEAD_KV * head_dim
    q_dim = n_head * head_dim
    for il in range(n_layer):
        p = f"blk.{il}."
        if arch != "olmo2":  # olmo2: post-norms only (below)
            w.add_tensor(p + "attn_norm.weight", norm(N_EMBD))
        wq = mat(q_dim, N_EMBD, 1.5 / np.sqrt(N_EMBD))
        wk = mat(kv_dim, N_EMBD, 1.5 / np.sqrt(N_EMBD))
        wv = mat(kv_dim, N_EMBD, 1.0 / np.sqrt(N_EMBD))
        if arch == "phi3" and not longrope:  # fused: Q's rows, K's, V's
            w.add_tensor(p + "attn_qkv.weight", np.concatenate([wq, wk, wv]))
        else:
            w.add_tensor(p + "attn_q.weight", wq)
            w.add_tensor(p + "attn_k.weight", wk)
            w.add_tensor(p + "attn_v.weight", wv)
        if arch in ("qwen2", "qwen2moe", "gpt-oss"):
            w.add_tensor(p + "attn_q.bias", (0.5 * rng.standard_normal(q_dim, dtype=np.float32)))
            w.add_tensor(p + "attn_k.bias", (0.5 * rng.standard_normal(kv_dim, dtype=np.float32)))
            w.add_tensor(p + "attn_v.bias", (0.1 * rng.standard_normal(kv_dim, dtype=np.float32)))
        if arch in ("qwen3", "qwen3moe"):  # per-head norms; unit RMS after them, so scale the weights up a little
            w.add_tensor(p + "attn_q_norm.weight", (1.5 * norm(head_dim)).astype(np.float32))
            w.add_tensor(p + "attn_k_norm.weight", (1.5 * norm(head_dim)).astype(np.float32))
        if arch == "olmo2":  # one weight per row of all heads
            w.add_tensor(p + "attn_q_norm.weight", (1.5 * norm(q_dim)).astype(np.float32))
            w.add_tensor(p + "attn_k_norm.weight", (1.5 * norm(kv_dim)).astype(np.float32))
        w.add_tensor(p + "attn_output.weight", mat(N_EMBD, q_dim, 1.0 / np.sqrt(q_dim)))
        if arch == "gpt-oss":  # the output's bias, the sinks, and the FFN's norm under its post-attention name
            w.add_tensor(p + "attn_output.bias", (0.1 * rng.standard_normal(N_EMBD, dtype=np.float32)))
            w.add_tensor(p + "attn_sinks.weight",
                         (GPT_OSS_SINK_MEAN + GPT_OSS_SINK_STD * rng.standard_normal(n_head, dtype=np.float32)))
        if arch in ("gemma2", "olmo2", "gpt-oss"):
            w.add_tensor(p + "post_attention_norm.weight", norm(N_EMBD))
        if arch not in ("olmo2", "gpt-oss"):
            w.add_tensor(p + "ffn_norm.weight", norm(N_EMBD))
        if arch in ("qwen3moe", "qwen2moe", "gpt-oss") or moe:  # router scores of std 1.5: distinct choices; experts as numpy (expert, rows, cols)
            w.add_tensor(p + "ffn_gate_inp.weight",
                         rng.standard_normal((MOE_N_EXPERT, N_EMBD), dtype=np.float32) * np.float32(1.5 / np.sqrt(N_EMBD)))
            # gpt-oss: gate and up of std 3 (its clamp at 7 bites now and then), and biases
            gu_std = (3.0 if arch == "gpt-oss" else 1.0) / np.sqrt(N_EMBD)
            for name, rows, cols, std in [("gate", MOE_N_FF, N_EMBD, gu_std),
                                          ("up", MOE_N_FF, N_EMBD, gu_std),
                                          ("down", N_EMBD, MOE_N_FF, 2.0 / np.sqrt(MOE_N_FF))]:
                w.add_tensor(p + f"ffn_{name}_exps.weight",
                             (rng.standard_normal((MOE_N_EXPERT, rows, cols), dtype=np.float32) * std).astype(np.float16))
            if arch == "gpt-oss":  # numpy (expert, rows) = ggml ne [rows, n_expert]
                w.add_tensor(p + "ffn_gate_inp.bias", 0.5 * rng.standard_normal(MOE_N_EXPERT, dtype=np.float32))
                for name, rows in [("gate", MOE_N_FF), ("up", MOE_N_FF), ("down", N_EMBD)]:
                    w.add_tensor(p + f"ffn_{name}_exps.bias",
                                 0.3 * rng.standard_normal((MOE_N_EXPERT, rows), dtype=np.float32))
            if arch == "qwen2moe":  # the shared expert; its gate's input scores of std 1.5
                w.add_tensor(p + "ffn_gate_inp_shexp.weight",
                             rng.standard_normal(N_EMBD, dtype=np.float32) * np.float32(1.5 / np.sqrt(N_EMBD)))
                w.add_tensor(p + "ffn_gate_shexp.weight", mat(QWEN2MOE_N_FF_SHEXP, N_EMBD, 1.0 / np.sqrt(N_EMBD)))
                w.add_tensor(p + "ffn_up_shexp.weight", mat(QWEN2MOE_N_FF_SHEXP, N_EMBD, 1.0 / np.sqrt(N_EMBD)))
                w.add_tensor(p + "ffn_down_shexp.weight",
                             mat(N_EMBD, QWEN2MOE_N_FF_SHEXP, 1.0 / np.sqrt(QWEN2MOE_N_FF_SHEXP)))
        elif arch == "phi3":  # fused gate-up: gate's rows, then up's
            w.add_tensor(p + "ffn_up.weight", mat(2 * N_FF, N_EMBD, 1.0 / np.sqrt(N_EMBD)))
            w.add_tensor(p + "ffn_down.weight", mat(N_EMBD, N_FF, 1.0 / np.sqrt(N_FF)))
        else:
            w.add_tensor(p + "ffn_gate.weight", mat(N_FF, N_EMBD, 1.0 / np.sqrt(N_EMBD)))
            w.add_tensor(p + "ffn_up.weight", mat(N_FF, N_EMBD, 1.0 / np.sqrt(N_EMBD)))
            w.add_tensor(p + "ffn_down.weight", mat(N_EMBD, N_FF, 1.0 / np.sqrt(N_FF)))
        if arch in ("gemma2", "olmo2"):
            w.add_tensor(p + "post_ffw_norm.weight", norm(N_EMBD))
    if tied:
        w.add_tensor("output_norm.weight",
                     (LOGIT_STD / (emb_std * np.sqrt(N_EMBD)) * rng.standard_normal(N_EMBD)).astype(np.float32))
    else:
        w.add_tensor("output_norm.weight", norm(N_EMBD))
        logit_scale = GRANITE_LOGIT_SCALE if arch == "granite" else 1.0  # granite divides the logits by it
        w.add_tensor("output.weight", mat(n_vocab, N_EMBD, logit_scale * LOGIT_STD / np.sqrt(N_EMBD)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def quantize(src: str, dst: str, ftype: int) -> None:
    import llama_cpp  # only needed here; the F16 files need just gguf + numpy

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = 2
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({src} -> {dst}, ftype {ftype}) returned {rc}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "tests/model/data"))
    ap.add_argument("--arch", action="append", choices=ARCHS, help="only these (default: all)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    total = 0
    for model, arch, seed, quants in MODELS:
        if args.arch and model not in args.arch:
            continue
        f16 = os.path.join(args.out, f"tiny-{model}-f16.gguf")
        write_f16(arch, f16, seed, yarn=model.endswith("-yarn"), longrope=model.endswith("-longrope"),
                  moe=model == "mixtral")
        paths = [f16]
        for name, ftype in quants:
            paths.append(os.path.join(args.out, f"tiny-{model}-{name}.gguf"))
            quantize(f16, paths[-1], ftype)
        for p in paths:
            size = os.path.getsize(p)
            total += size
            print(f"{os.path.relpath(p, ROOT)}: {size} bytes")
    print(f"total: {total} bytes ({total / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
