#!/usr/bin/env python3
"""An exact reference for the small generated models: their forward pass in float64, against which
fitllm's and llama.cpp's logits are both measured.

  .venv/bin/python tools/f64_reference.py [--fitllm-logits build/tests/fitllm_logits] [--generated] [NAME ...]

For each model of tests/model/data/ (tiny-llama-*, tiny-qwen2-*, tiny-qwen3-*, tiny-qwen3-yarn-*, tiny-gemma2-*, tiny-phi3-*,
tiny-gpt-oss-*;
NAME limits it: tiny-qwen3-q8_0 ...) every tensor is dequantized with gguf-py
(gguf.quants.dequantize) to float64: the very weights both runtimes multiply with, so what is left
between them and this pass is each runtime's own arithmetic (activations rounded to Q8_0 / Q8_K or
f16 for the weight kernels, f16 K/V cache, float32 sums, approximate exp). The pass itself is the
formulas in float64 and nothing else: RMSNorm, Q/K/V (+ biases for qwen2, per-head RMS norms of Q
and K for qwen3), RoPE (normal for llama, NeoX for qwen; YaRN as llama.cpp's rope_yarn), exact
softmax attention over every earlier position with GQA, SwiGLU, the output matrix; for gemma2 the
embedding times sqrt(n_embd), post-attention and post-FFN norms, GELU (tanh form) for SiLU,
tanh soft-capping of the scores and the logits, and the sliding window on layers il % 2 == 0; for
phi3 (tiny-phi3-*) the fused attn_qkv and gate-up ffn_up split into their parts, NeoX RoPE on
rope.dimension_count dims, and LongRoPE's long factors and attn_factor (fitllm_logits and the
llama.cpp side both run a context of 2048, past the files' original 32); for gpt-oss Q/K/V and
output biases, NeoX RoPE with YaRN, the sliding window on the even layers, attention sinks (one
more logit per head in each softmax), post_attention_norm before the routed experts: the top-k
router logits (+ bias) softmaxed among themselves, each expert down(swiglu_oai(gate, up)) with
its biases (MXFP4 experts in the mxfp4_moe file).

For each prompt of tests/model/goldens/<name>.json (prompt_ids; top_logits: llama.cpp's top-10
[id, logit] after the prompt) it compares with the f64 logits after the prompt:
  llama.cpp  mean / max |logit - f64| over llama.cpp's top-10 ids; KL(f64 || llama.cpp) over the
             whole vocabulary when llama-cpp-python (`import llama_cpp`, scripts/setup.sh --oracle)
             gives its full logits, else the errors come from the goldens' top-10 alone
  fitllm     the same over the same ids, and KL(f64 || fitllm), from --fitllm-logits (the
             fitllm_logits program of the build, tools/fitllm_logits.cpp: model path and ids in,
             every logit out; `cmake --build build --target fitllm_logits`)
and prints one row per file. --json FILE writes the rows (tests/tools/f64_reference_test.py).
--repacked adds llama.cpp once more in its default repacked CPU buffers (a second llama.cpp: where
its two kernel sets part, that is the noise of where roundings fall).

--generated (or a NAME of them: tiny-llama-q4_1 ...) adds the weight types no committed file holds
(GENERATED: BF16, Q4_1, Q5_0, Q5_1, Q3_K_S/M/L, Q4_K_S, Q5_K_S, IQ4_NL, IQ3_S, IQ3_M, IQ3_XS,
IQ3_XXS, IQ2_M, IQ2_S, IQ2_XS, IQ2_XXS, IQ1_M, IQ1_S, Q2_K_S, TQ2_0, TQ1_0, MXFP4), made from tiny-llama-f16 in a temporary directory
(--keep DIR keeps them) by llama.cpp's quantizer through llama-cpp-python, those that need an
importance matrix by `fitllm quantize --imatrix` (llama-quantize's bytes) with one from this f64
pass over seeded random ids. They have no goldens: they run tiny-llama-f16's prompts, measured over
llama.cpp's top-10 ids of this run, so they need llama_cpp.
"""
import argparse
import ctypes
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

import gguf
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests/model/data")
GOLDENS = os.path.join(ROOT, "tests/model/goldens")
ARCH_PREFIXES = ("tiny-llama-", "tiny-qwen2-", "tiny-qwen3-", "tiny-gemma2-", "tiny-phi3-", "tiny-gpt-oss-")


def field(reader: gguf.GGUFReader, key: str, default=None):
    f = reader.get_field(key)
    return default if f is None else f.contents()


class Model:
    """The hyper-parameters and float64 weights of one file."""

    def __init__(self, path: str):
        r = gguf.GGUFReader(path)
        self.arch = field(r, "general.architecture")
        a = self.arch
        self.n_layer = field(r, f"{a}.block_count")
        self.n_head = field(r, f"{a}.attention.head_count")
        self.n_head_kv = field(r, f"{a}.attention.head_count_kv")
        self.n_embd = field(r, f"{a}.embedding_length")
        self.eps = field(r, f"{a}.attention.layer_norm_rms_epsilon")
        self.head_dim = field(r, f"{a}.attention.key_length", self.n_embd // self.n_head)
        self.n_rot = field(r, f"{a}.rope.dimension_count", self.head_dim)
        self.rope_base = field(r, f"{a}.rope.freq_base", 10000.0)
        self.neox = a in ("qwen2", "qwen3", "gemma2", "phi3", "gpt-oss")
        self.gemma2 = a == "gemma2"
        self.gpt_oss = a == "gpt-oss"
        # gemma2 (llama.cpp's defaults when a key is absent): window and caps; Q scaled by
        # 1/sqrt(head_dim), or 1/sqrt(n_embd / n_head) for the 46-layer 27B. gpt-oss: its window
        # on the even layers too (the file's window, no sliding_window_pattern in these files).
        self.window = field(r, f"{a}.attention.sliding_window", 4096) if self.gemma2 or self.gpt_oss else 0
        self.n_expert_used = field(r, f"{a}.expert_used_count", 0)
        self.attn_cap = field(r, f"{a}.attn_logit_softcapping", 50.0) if self.gemma2 else 0.0
        self.final_cap = field(r, f"{a}.final_logit_softcapping", 30.0) if self.gemma2 else 0.0
        scaling = field(r, f"{a}.rope.scaling.type", "none")
        factor = field(r, f"{a}.rope.scaling.factor", 1.0)
        self.yarn = scaling == "yarn"
        self.freq_scale = 1.0 / factor if scaling != "none" and factor > 0 else 1.0
        self.orig_ctx = field(r, f"{a}.rope.scaling.original_context_length", field(r, f"{a}.context_length"))
        # phi3's LongRoPE: cos and sin times attn_factor (whatever the context).
        self.attn_factor = field(r, f"{a}.rope.scaling.attn_factor", 1.0)
        self.w = {}
        for t in r.tensors:
            # dequantize() gives numpy's shape (ggml's ne reversed): rows x columns for a matrix.
            self.w[t.name] = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float64)
        if "output.weight" not in self.w:
            self.w["output.weight"] = self.w["token_embd.weight"]
        # phi3's fused tensors: attn_qkv is Q's rows, K's, V's; ffn_up of 2 n_ff rows gate's, then up's.
        q_dim, kv_dim = self.n_head * self.head_dim, self.n_head_kv * self.head_dim
        for il in range(self.n_layer):
            p = f"blk.{il}."
            if p + "attn_qkv.weight" in self.w:
                qkv = self.w.pop(p + "attn_qkv.weight")
                self.w[p + "attn_q.weight"] = qkv[:q_dim]
                self.w[p + "attn_k.weight"] = qkv[q_dim:q_dim + kv_dim]
                self.w[p + "attn_v.weight"] = qkv[q_dim + kv_dim:]
            if p + "ffn_gate.weight" not in self.w and p + "ffn_up.weight" in self.w:
                up = self.w.pop(p + "ffn_up.weight")
                self.w[p + "ffn_gate.weight"], self.w[p + "ffn_up.weight"] = up[:up.shape[0] // 2], up[up.shape[0] // 2:]
        self.n_vocab = self.w["output.weight"].shape[0]

    def rope_angles(self, n_pos: int) -> tuple[np.ndarray, np.ndarray, float]:
        """cos, sin [n_pos, n_rot/2] and the magnitude factor, as llama.cpp's rope_yarn: pair i turns
        by theta_extrap = pos * base^(-2i/n_rot); YaRN mixes theta_interp = freq_scale * theta_extrap
        in along a ramp over the pairs between the corrections dims of beta 32 and 1, and scales cos
        and sin by 1 + 0.1 ln(1 / freq_scale)."""
        i = np.arange(self.n_rot // 2, dtype=np.float64)
        theta_extrap = np.arange(n_pos, dtype=np.float64)[:, None] * self.rope_base ** (-2.0 * i / self.n_rot)
        # phi3's LongRoPE divisors: the long ones, as both runtimes pick for a context (2048) past
        # the original one.
        if "rope_factors_long.weight" in self.w:
            theta_extrap = theta_extrap / self.w["rope_factors_long.weight"]
        theta_interp = self.freq_scale * theta_extrap
        mscale = self.attn_factor
        if self.yarn:
            def corr_dim(beta: float) -> float:
                return self.n_rot * math.log(self.orig_ctx / (beta * 2 * math.pi)) / (2 * math.log(self.rope_base))
            low = max(0.0, math.floor(corr_dim(32.0)))
            high = min(self.n_rot - 1.0, math.ceil(corr_dim(1.0)))
            ramp = 1.0 - np.clip((i - low) / max(0.001, high - low), 0.0, 1.0)
            theta = theta_interp * (1 - ramp) + theta_extrap * ramp
            mscale *= 1.0 + 0.1 * math.log(1.0 / self.freq_scale)
        else:
            theta = theta_interp
        return np.cos(theta), np.sin(theta), mscale

    def rope(self, x: np.ndarray, cos: np.ndarray, sin: np.ndarray, mscale: float) -> np.ndarray:
        """x: [n_pos, n_heads, head_dim]."""
        half = self.n_rot // 2
        if self.neox:
            a, b = np.arange(half), np.arange(half) + half
        else:
            a, b = 2 * np.arange(half), 2 * np.arange(half) + 1
        x0, x1 = x[:, :, a], x[:, :, b]
        c, s = cos[:, None, :], sin[:, None, :]
        out = x.copy()
        out[:, :, a] = mscale * (x0 * c - x1 * s)
        out[:, :, b] = mscale * (x0 * s + x1 * c)
        return out

    def rmsnorm(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def logits(self, ids: list[int], record: dict | None = None) -> np.ndarray:
        """float64 logits after the last of ids (at positions 0 .. n-1). record, when given, gathers
        what llama-imatrix does: for each weight matrix of the blocks, the sum over positions of its
        input's squares per column and the number of positions ({name: [sums, count]})."""
        w, n, hd = self.w, len(ids), self.head_dim

        def seen(names: list[str], x: np.ndarray) -> None:
            if record is None:
                return
            for name in names:
                sums, count = record.get(name, (0.0, 0))
                record[name] = [sums + np.sum(x * x, axis=0), count + x.shape[0]]
        x = w["token_embd.weight"][ids]
        if self.gemma2:
            x = x * math.sqrt(self.n_embd)
        cos, sin, mscale = self.rope_angles(n)
        mask = np.triu(np.full((n, n), -np.inf), k=1)
        pos = np.arange(n)
        # gemma2's local layers: a query at p sees keys at positions > p - window.
        window_mask = np.where(pos[None, :] <= pos[:, None] - self.window, -np.inf, 0.0) if self.window else 0.0
        scale = 1.0 / math.sqrt(self.n_embd // self.n_head if self.gemma2 and self.n_layer == 46 else hd)
        group = self.n_head // self.n_head_kv
        for il in range(self.n_layer):
            p = f"blk.{il}."
            h = self.rmsnorm(x, w[p + "attn_norm.weight"])
            seen([p + f"attn_{m}.weight" for m in "qkv"], h)
            q, k, v = (h @ w[p + f"attn_{m}.weight"].T + w.get(p + f"attn_{m}.bias", 0.0) for m in "qkv")
            q = q.reshape(n, self.n_head, hd)
            k = k.reshape(n, self.n_head_kv, hd)
            v = v.reshape(n, self.n_head_kv, hd)
            if p + "attn_q_norm.weight" in w:
                q = self.rmsnorm(q, w[p + "attn_q_norm.weight"])
                k = self.rmsnorm(k, w[p + "attn_k_norm.weight"])
            q, k = self.rope(q, cos, sin, mscale), self.rope(k, cos, sin, mscale)
            k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)  # query head j reads KV head j // group
            scores = np.einsum("qhd,khd->hqk", q, k) * scale
            if self.attn_cap:
                scores = self.attn_cap * np.tanh(scores / self.attn_cap)
            scores = scores + mask + (window_mask if self.window and il % 2 == 0 else 0.0)
            # gpt-oss's sinks: one more logit per head in each softmax, its column dropped after.
            sinks = w[p + "attn_sinks.weight"][:, None, None] if p + "attn_sinks.weight" in w else -np.inf
            top = np.maximum(scores.max(axis=-1, keepdims=True), sinks)
            scores = np.exp(scores - top)
            scores /= scores.sum(axis=-1, keepdims=True) + np.exp(sinks - top)
            attn = np.einsum("hqk,khd->qhd", scores, v).reshape(n, self.n_head * hd)
            seen([p + "attn_output.weight"], attn)
            attn = attn @ w[p + "attn_output.weight"].T + w.get(p + "attn_output.bias", 0.0)
            if self.gemma2:
                attn = self.rmsnorm(attn, w[p + "post_attention_norm.weight"])
            x = x + attn
            if self.gpt_oss:
                x = x + self.experts(p, self.rmsnorm(x, w[p + "post_attention_norm.weight"]))
                continue
            h = self.rmsnorm(x, w[p + "ffn_norm.weight"])
            seen([p + "ffn_gate.weight", p + "ffn_up.weight"], h)
            gate, up = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
            if self.gemma2:
                act = 0.5 * gate * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (gate + 0.044715 * gate ** 3)))
            else:
                act = gate / (1.0 + np.exp(-gate))
            seen([p + "ffn_down.weight"], act * up)
            ffn = (act * up) @ w[p + "ffn_down.weight"].T
            if self.gemma2:
                ffn = self.rmsnorm(ffn, w[p + "post_ffw_norm.weight"])
            x = x + ffn
        logits = self.rmsnorm(x[-1], w["output_norm.weight"]) @ w["output.weight"].T
        return self.final_cap * np.tanh(logits / self.final_cap) if self.final_cap else logits


    def experts(self, p: str, h: np.ndarray) -> np.ndarray:
        """gpt-oss's routed experts (llama.cpp's SOFTMAX_WEIGHT gating, SWIGLU_OAI_MOE): the top
        n_expert_used router logits (+ bias) of each row, weighted by a softmax over those alone;
        each expert down(swiglu_oai(gate h + b, up h + b)) + b, with SwiGLU-OAI's alpha 1.702 and
        limit 7: gate clamped above, up both ways, gate * sigmoid(alpha gate) * (up + 1)."""
        w = self.w
        logits = h @ w[p + "ffn_gate_inp.weight"].T + w[p + "ffn_gate_inp.bias"]
        out = np.zeros_like(h)
        for t in range(h.shape[0]):
            chosen = np.argsort(-logits[t], kind="stable")[:self.n_expert_used]
            weights = np.exp(logits[t, chosen] - logits[t, chosen].max())
            weights /= weights.sum()
            for e, wt in zip(chosen, weights):
                gate = np.minimum(w[p + "ffn_gate_exps.weight"][e] @ h[t] + w[p + "ffn_gate_exps.bias"][e], 7.0)
                up = np.clip(w[p + "ffn_up_exps.weight"][e] @ h[t] + w[p + "ffn_up_exps.bias"][e], -7.0, 7.0)
                act = gate / (1.0 + np.exp(-1.702 * gate)) * (up + 1.0)
                out[t] += wt * (w[p + "ffn_down_exps.weight"][e] @ act + w[p + "ffn_down_exps.bias"][e])
        return out


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = np.asarray(z, dtype=np.float64)
    z = z - z.max()
    return z - math.log(np.exp(z).sum())


def kl(ref: np.ndarray, other: np.ndarray) -> float:
    """KL(softmax(ref) || softmax(other)), in nats."""
    lp, lq = log_softmax(ref), log_softmax(other)
    return float(np.sum(np.exp(lp) * (lp - lq)))


class LlamaCpp:
    """llama.cpp's full logits through llama-cpp-python, set up as tools/gen_model_goldens.py
    (n_ubatch 512, 2 threads, its default flash attention). extra_bufts off: plain CPU buffers, no
    repacking of the weights for the CPU's AMX / AVX-512 kernels (the AMX repack crashes on IQ4_XS
    batches)."""

    _quiet = None  # the no-op log callback, kept alive while llama.cpp holds it

    @staticmethod
    def quiet():
        """llama_cpp, its log silenced."""
        import llama_cpp
        if LlamaCpp._quiet is None:
            LlamaCpp._quiet = llama_cpp.llama_log_callback(lambda level, text, data: None)
            llama_cpp.llama_log_set(LlamaCpp._quiet, ctypes.c_void_p(0))
        return llama_cpp

    def __init__(self, path: str, extra_bufts: bool):
        llama_cpp = self.lc = LlamaCpp.quiet()
        params = llama_cpp.llama_model_default_params()
        params.use_extra_bufts = extra_bufts
        self.model = llama_cpp.llama_model_load_from_file(path.encode(), params)
        if not self.model:
            raise RuntimeError(f"llama.cpp cannot load {path}")
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(self.model))

    def logits(self, ids: list[int]) -> np.ndarray:
        lc = self.lc
        cparams = lc.llama_context_default_params()
        cparams.n_ctx, cparams.n_batch, cparams.n_ubatch = 2048, 2048, 512
        cparams.n_threads = cparams.n_threads_batch = 2
        ctx = lc.llama_init_from_model(self.model, cparams)
        arr = (lc.llama_token * len(ids))(*ids)
        if lc.llama_decode(ctx, lc.llama_batch_get_one(arr, len(ids))) != 0:
            raise RuntimeError("llama_decode failed")
        row = ctypes.cast(lc.llama_get_logits_ith(ctx, -1), ctypes.POINTER(ctypes.c_float))
        out = np.array(row[:self.n_vocab], dtype=np.float64)
        lc.llama_free(ctx)
        return out

    def close(self) -> None:
        self.lc.llama_model_free(self.model)


def fitllm_logits(program: str, path: str, prompts: list[list[int]], n_vocab: int) -> list[np.ndarray]:
    """fitllm's logits after each prompt: `program MODEL` reads one prompt per line (ids separated
    by spaces) and writes one line of n_vocab logits per prompt."""
    stdin = "".join(" ".join(map(str, ids)) + "\n" for ids in prompts)
    out = subprocess.run([program, path], input=stdin, capture_output=True, text=True, check=True).stdout
    rows = [np.array(line.split(), dtype=np.float64) for line in out.splitlines() if line.strip()]
    if len(rows) != len(prompts) or any(r.shape != (n_vocab,) for r in rows):
        raise RuntimeError(f"{program} {path}: expected {len(prompts)} rows of {n_vocab} logits")
    return rows


def tiny_names() -> list[str]:
    return sorted(f[:-5] for f in os.listdir(DATA) if f.endswith(".gguf") and f.startswith(ARCH_PREFIXES))


# The weight types no committed file holds, made from tiny-llama-f16 by --generated: (name suffix,
# llama_ftype name, how). "llama": llama.cpp's own quantizer (llama_model_quantize through
# llama-cpp-python), its usual mix for the type; "pure": the same with every matrix in the type
# (MXFP4_MOE's mix gives a dense model Q8_0 alone); "imatrix": fitllm quantize --imatrix, whose bytes
# are llama-quantize --imatrix's (tests/quant/ggml_oracle_test.cpp), with an importance matrix from
# this file's f64 pass, since llama_model_quantize takes one only as a C++ map and these types refuse
# to quantize without one.
GENERATED = (
    ("bf16", "BF16", "llama"), ("q4_1", "Q4_1", "llama"), ("q5_0", "Q5_0", "llama"),
    ("q5_1", "Q5_1", "llama"), ("q3_k_s", "Q3_K_S", "llama"), ("q3_k_m", "Q3_K_M", "llama"),
    ("q4_k_s", "Q4_K_S", "llama"), ("q5_k_s", "Q5_K_S", "llama"), ("iq4_nl", "IQ4_NL", "llama"),
    ("iq3_s", "IQ3_S", "llama"), ("iq3_xxs", "IQ3_XXS", "imatrix"), ("iq2_s", "IQ2_S", "imatrix"),
    ("iq2_xs", "IQ2_XS", "imatrix"), ("iq2_xxs", "IQ2_XXS", "imatrix"), ("iq1_m", "IQ1_M", "imatrix"),
    ("iq1_s", "IQ1_S", "imatrix"), ("tq2_0", "TQ2_0", "llama"), ("tq1_0", "TQ1_0", "llama"),
    ("mxfp4", "MXFP4_MOE", "pure"), ("q3_k_l", "Q3_K_L", "llama"), ("iq3_m", "IQ3_M", "llama"),
    ("iq3_xs", "IQ3_XS", "imatrix"), ("iq2_m", "IQ2_M", "imatrix"), ("q2_k_s", "Q2_K_S", "imatrix"),
)
GENERATED_SOURCE = "tiny-llama-f16"


def write_imatrix(model: Model, path: str, n_seq: int = 8, n_tok: int = 128, seed: int = 23) -> None:
    """llama-imatrix's legacy .dat file for model: per matrix the mean square of each input column
    over n_seq sequences of n_tok random token ids (seeded; not the golden prompts measured), as the
    f64 pass computes them. Entries: name, ncall 1, the values (llama-quantize divides by ncall)."""
    rng = np.random.default_rng(seed)
    record: dict = {}
    for _ in range(n_seq):
        model.logits([int(t) for t in rng.integers(0, model.n_vocab, n_tok)], record)
    with open(path, "wb") as f:
        f.write(struct.pack("<i", len(record)))
        for name, (sums, count) in sorted(record.items()):
            raw = name.encode()
            f.write(struct.pack("<i", len(raw)) + raw + struct.pack("<ii", 1, len(sums)))
            f.write(np.asarray(sums / count, dtype="<f4").tobytes())


def make_generated(outdir: str, fitllm: str, names: list[str] | None = None) -> dict[str, str]:
    """Writes the GENERATED files of names (tiny-llama-q4_1 ...; None: all) into outdir: {name: path}."""
    llama_cpp = LlamaCpp.quiet()
    src = os.path.join(DATA, GENERATED_SOURCE + ".gguf")
    imatrix = None
    out = {}
    for suffix, ftype, how in GENERATED:
        name = "tiny-llama-" + suffix
        if names is not None and name not in names:
            continue
        path = os.path.join(outdir, name + ".gguf")
        if how == "imatrix":
            if imatrix is None:
                imatrix = os.path.join(outdir, GENERATED_SOURCE + ".imatrix.dat")
                write_imatrix(Model(src), imatrix)
            subprocess.run([fitllm, "quantize", "-t", "2", "--force", "--imatrix", imatrix, src, path, ftype],
                           check=True, capture_output=True)
        else:
            params = llama_cpp.llama_model_quantize_default_params()
            params.ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + ftype)
            params.nthread = 2
            params.pure = how == "pure"
            if llama_cpp.llama_model_quantize(src.encode(), path.encode(), ctypes.byref(params)) != 0:
                raise RuntimeError(f"llama_model_quantize {ftype} failed")
        out[name] = path
    return out


def measure(name: str, program: str | None, use_llama_cpp: bool, path: str | None = None,
            repacked: bool = False) -> dict:
    """One row. path: a file outside tests/model/data (a generated one), without goldens of its own:
    it is measured on the prompts of its source's goldens, over llama.cpp's top-10 ids of this run.
    repacked: llama.cpp once more with its extra buffer types (the weights repacked for the CPU's
    AVX-512 / AMX kernels, llama.cpp's default), as llama_cpp_repacked_*."""
    path = path or os.path.join(DATA, name + ".gguf")
    model = Model(path)
    golden = os.path.join(GOLDENS, name + ".json")
    if not os.path.exists(golden):
        if not use_llama_cpp:
            raise RuntimeError(f"{name}: no goldens, and llama_cpp is needed for its top-10 ids")
        golden = os.path.join(GOLDENS, GENERATED_SOURCE + ".json")
    with open(golden, encoding="utf-8") as f:
        cases = json.load(f)["cases"]
    prompts = [c["prompt_ids"] for c in cases]
    refs = [model.logits(ids) for ids in prompts]
    row = {"file": name, "cases": len(cases)}

    def errors(key: str, values: list[np.ndarray] | None) -> None:
        diffs = []
        for c, ref, got in zip(cases, refs, values or [None] * len(cases)):
            for tid, golden in c["top_logits"]:
                diffs.append(abs((golden if got is None else got[tid]) - ref[tid]))
        row[key + "_mean"] = float(np.mean(diffs))
        row[key + "_max"] = float(np.max(diffs))
        if values is not None:
            row[key + "_kl"] = float(np.mean([kl(r, v) for r, v in zip(refs, values)]))

    full = None
    if use_llama_cpp:
        # Plain buffers: on an AMX CPU llama.cpp's repacked kernels crash on the IQ4_XS file.
        lc = LlamaCpp(path, extra_bufts=False)
        full = [lc.logits(ids) for ids in prompts]
        lc.close()
        if golden != os.path.join(GOLDENS, name + ".json"):
            # No goldens of its own: this run's top-10 stands for them.
            cases = [dict(c, top_logits=[[int(t), float(f[t])] for t in np.argsort(-f, kind="stable")[:10]])
                     for c, f in zip(cases, full)]
        # How far this run is from the goldens' top-10 (0 where it gives their bits).
        row["llama_cpp_vs_goldens"] = max(abs(got[tid] - golden) for c, got in zip(cases, full)
                                          for tid, golden in c["top_logits"])
    errors("llama_cpp", full)
    if use_llama_cpp and repacked:
        lc = LlamaCpp(path, extra_bufts=True)
        errors("llama_cpp_repacked", [lc.logits(ids) for ids in prompts])
        lc.close()
    if program:
        errors("fitllm", fitllm_logits(program, path, prompts, model.n_vocab))
    return row


def llama_cpp_available() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("names", nargs="*", help="only these files (tiny-qwen3-q8_0 ...); default: every tiny model")
    default = os.path.join(ROOT, "build/tests/fitllm_logits")
    ap.add_argument("--fitllm-logits", default=default if os.access(default, os.X_OK) else None,
                    help="fitllm's logits program (default: build/tests/fitllm_logits when built)")
    ap.add_argument("--goldens-only", action="store_true",
                    help="llama.cpp's side from the goldens' top-10 even when llama_cpp is importable")
    ap.add_argument("--json", help="also write the rows to this file")
    ap.add_argument("--generated", action="store_true",
                    help="also the weight types no committed file holds (GENERATED), made from "
                         "tiny-llama-f16 in a temporary directory; needs llama_cpp and --fitllm")
    ap.add_argument("--fitllm", default=os.path.join(ROOT, "build/fitllm"),
                    help="fitllm's program, for quantize --imatrix (default: build/fitllm)")
    ap.add_argument("--keep", metavar="DIR", help="write the generated files into DIR and keep them")
    ap.add_argument("--repacked", action="store_true",
                    help="also llama.cpp with its repacked CPU kernels (extra buffer types; may crash on AMX CPUs)")
    args = ap.parse_args()
    use_lc = not args.goldens_only and llama_cpp_available()
    gen_names = ["tiny-llama-" + g[0] for g in GENERATED]
    if args.names:
        committed = [n for n in args.names if n not in gen_names]
        wanted = [n for n in args.names if n in gen_names] or (gen_names if args.generated else [])
    else:
        committed, wanted = tiny_names(), gen_names if args.generated else []
    if wanted and not use_lc:
        ap.error("the generated files need llama_cpp (llama-cpp-python, scripts/setup.sh --oracle)")
    with tempfile.TemporaryDirectory(prefix="f64ref-") as tmp:
        if args.keep:
            os.makedirs(args.keep, exist_ok=True)
        generated = make_generated(args.keep or tmp, args.fitllm, wanted) if wanted else {}
        rows = [measure(n, args.fitllm_logits, use_lc, repacked=args.repacked) for n in committed]
        rows += [measure(n, args.fitllm_logits, use_lc, p, args.repacked) for n, p in generated.items()]

    def cell(r: dict, key: str) -> str:
        if key + "_mean" not in r:
            return "-"
        s = f"{r[key + '_mean']:.4f} / {r[key + '_max']:.4f}"
        return s + (f"  {r[key + '_kl']:.2e}" if key + "_kl" in r else "")

    src = "llama-cpp-python" if use_lc else "goldens' top-10"
    print(f"|logit - f64| over llama.cpp's top-10 (mean / max), KL(f64 || x) over the vocabulary; llama.cpp: {src}")
    rp = args.repacked and use_lc
    print(f"{'file':24} {'llama.cpp':28} " + (f"{'llama.cpp repacked':28} " if rp else "") + f"{'fitllm':28}")
    for r in rows:
        print(f"{r['file']:24} {cell(r, 'llama_cpp'):28} " + (f"{cell(r, 'llama_cpp_repacked'):28} " if rp else "")
              + f"{cell(r, 'fitllm'):28}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"llama_cpp_source": src, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
