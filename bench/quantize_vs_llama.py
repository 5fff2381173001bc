#!/usr/bin/env python3
"""`fitllm quantize` against llama.cpp's llama-quantize on the same F16 file: every tensor's type
and bytes compared, time and peak RSS of both.

  .venv/bin/python bench/quantize_vs_llama.py [--types Q8_0 Q4_K_M ...] [--src F16.gguf] [-t 2]
  .venv/bin/python bench/quantize_vs_llama.py --imatrix IMATRIX.gguf [--types ...]   # both with --imatrix

Without --src the source is the demo model (Gemma 3 270M Q4_K_M) dequantized to F16 by
`fitllm quantize --allow-requantize ... F16` (an F16 model like any other for this purpose).
llama-quantize is the one built in .cache/llama-server/build/bin (tools/build_llama_server.sh, then
`ninja -C .cache/llama-server/build llama-quantize llama-imatrix`), or --llama-quantize PATH. With
--imatrix both tools get the same importance matrix (llama-imatrix's, GGUF or legacy .dat; made e.g. by
`llama-imatrix -m models/gemma-3-270m-q4_k_m.gguf -f tests/data/gpl-3.0.txt -o demo.imatrix.gguf -c 512
--chunks 8 -t 2 -b 512`), and --include-weights / --exclude-weights too; the file types that need
one (IMATRIX_TYPES) join the default types. The quantize.imatrix.* keys are compared as well.
Prints one line per type: tensors with identical bytes, tensors that differ (type or bytes), the
output size, seconds and peak RSS (/usr/bin/time's maximum resident set) of each tool. Exit status
1 when any tensor differs.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import gguf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FITLLM = os.path.join(ROOT, "build", "fitllm")
LLAMA_QUANTIZE = os.path.join(ROOT, ".cache", "llama-server", "build", "bin", "llama-quantize")
DEMO = os.path.join(ROOT, "models", "gemma-3-270m-q4_k_m.gguf")
TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L",
         "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K", "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0", "IQ3_S", "IQ3_M"]
# The file types llama-quantize makes only with an importance matrix (joined to TYPES with --imatrix).
IMATRIX_TYPES = ["Q2_K_S", "IQ3_XXS", "IQ3_XS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ1_S", "IQ1_M"]


def timed(cmd: list) -> tuple:
    """Runs cmd under /usr/bin/time; returns (seconds, peak RSS in MiB)."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as t:
        subprocess.run(["/usr/bin/time", "-f", "%e %M", "-o", t.name] + cmd, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        seconds, kib = t.read().split()[-2:]
    return float(seconds), int(kib) / 1024


def compare(a: str, b: str) -> tuple:
    ra, rb = gguf.GGUFReader(a), gguf.GGUFReader(b)
    ta = {t.name: t for t in ra.tensors}
    tb = {t.name: t for t in rb.tensors}
    same, differ = 0, []
    for name, x in ta.items():
        y = tb.get(name)
        if y is None or x.tensor_type != y.tensor_type or x.data.tobytes() != y.data.tobytes():
            differ.append(name)
        else:
            same += 1
    differ += [n for n in tb if n not in ta]
    # The record of the importance matrix (quantize.imatrix.*): the same keys and values.
    def imatrix_keys(r):
        return {k: [bytes(p) for p in f.parts[f.data[0]:]] if f.data else []
                for k, f in r.fields.items() if k.startswith("quantize.imatrix.")}
    ka, kb = imatrix_keys(ra), imatrix_keys(rb)
    differ += [k for k in sorted(set(ka) | set(kb)) if ka.get(k) != kb.get(k)]
    return same, differ


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--types", nargs="+", default=TYPES)
    ap.add_argument("--src", help="an F16 / F32 / BF16 GGUF (default: the demo model dequantized to F16)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--imatrix", help="an importance matrix for both tools")
    ap.add_argument("--llama-quantize", default=LLAMA_QUANTIZE, help="llama.cpp's llama-quantize")
    ap.add_argument("--include-weights", action="append", default=[], help="passed to both (with --imatrix)")
    ap.add_argument("--exclude-weights", action="append", default=[], help="passed to both (with --imatrix)")
    args = ap.parse_args()
    if args.imatrix and args.types == TYPES:
        args.types = TYPES + IMATRIX_TYPES
    extra = ["--imatrix", args.imatrix] if args.imatrix else []
    for name in args.include_weights:
        extra += ["--include-weights", name]
    for name in args.exclude_weights:
        extra += ["--exclude-weights", name]
    with tempfile.TemporaryDirectory() as tmp:
        src = args.src
        if not src:
            src = os.path.join(tmp, "demo-f16.gguf")
            subprocess.run([FITLLM, "quantize", "--allow-requantize", DEMO, src, "F16"], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        print(f"source: {args.src or DEMO + ' as F16'}, {args.threads} threads"
              + (f", imatrix {args.imatrix}" if args.imatrix else ""))
        print(f"{'type':8} {'same':>5} {'differ':>6} {'MiB':>8} {'llama s':>8} {'fitllm s':>8} "
              f"{'llama RSS':>10} {'fitllm RSS':>10}")
        bad = 0
        for ty in args.types:
            ours, theirs = os.path.join(tmp, "fitllm.gguf"), os.path.join(tmp, "llama.gguf")
            ls, lr = timed([args.llama_quantize] + extra + [src, theirs, ty, str(args.threads)])
            fs, fr = timed([FITLLM, "quantize", "--force", "-t", str(args.threads)] + extra + [src, ours, ty])
            same, differ = compare(theirs, ours)
            bad += len(differ)
            print(f"{ty:8} {same:5d} {len(differ):6d} {os.path.getsize(ours) / 2**20:8.1f} {ls:8.2f} {fs:8.2f} "
                  f"{lr:9.0f}M {fr:9.0f}M" + (f"  differ: {', '.join(differ[:4])}" if differ else ""))
        return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
