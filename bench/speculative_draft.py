#!/usr/bin/env python3
"""Speculative decoding with a draft model (`fitllm run -md`), measured (issue 23): the demo model
converted to F16 as the target, the demo model itself (Gemma 3 270M Q4_K_M) as the draft, greedy,
on a few chat prompts, each with and without -md (alternating, --reps times each). The texts must
be identical (exit status 1 otherwise); the decode speed of each run is the `generated: N tokens,
X tok/s` of run's summary line (from the first generated token to the last, prompt excluded).

  .venv/bin/python bench/speculative_draft.py [--fitllm build/fitllm] [--target F16.gguf]
      [--draft Q4.gguf] [-n 128] [-t 2] [--reps 2] [--draft-max 8] [--draft-p-min 0.75]
      [--draft-vocab N] [--json out.json]

Without --target, the F16 target is made once from the demo model under .cache/ (each tensor
dequantized with the gguf package's numpy code: matrices to F16, vectors F32; the metadata as
is), not in the repository.

Reported per prompt: its tokens, the tokens generated, decode tok/s without and with the draft
(the best of the reps, the least disturbed on a shared machine), their ratio, the drafts accepted,
the seconds the draft model took, the target's passes (each checks one draft) and the time of one
(the generation's time less the draft model's, over the passes) in plain decoded tokens; then the
set's ratio of total decode time.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(ROOT, "models", "gemma-3-270m-q4_k_m.gguf")
F16 = os.path.join(ROOT, ".cache", "gemma-3-270m-f16.gguf")

PROMPTS = {
    "story": "Write a short story about a robot who learns to paint.",
    "explain": "Explain how a refrigerator keeps food cold, in simple words.",
    "list": "Give me ten tips for learning a new language, one per line.",
    "letter": "Write a polite letter to a neighbour asking them to keep their dog quiet at night.",
}

SUMMARY = re.compile(r"prompt: (\d+) tokens, [\d.]+ tok/s \| generated: (\d+) tokens, ([\d.]+) tok/s")
DRAFTS = re.compile(r"draft model: (\d+) drafted, (\d+) accepted")
DRAFT_TIME = re.compile(r"draft model: .* proposed, ([\d.]+) s of the ([\d.]+) s of generation")
PASSES = re.compile(r"tokens in (\d+) forward passes")


def make_f16(src: str, dst: str) -> None:
    """Dequantizes src into an F16 GGUF at dst (matrices F16, 1-D tensors F32)."""
    import numpy as np
    import gguf

    print(f"making {dst} from {src} ...", file=sys.stderr)
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst + ".part", r.fields["general.architecture"].contents())
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.file_type"):
            continue
        vtype = f.types[0]
        w.add_key_value(name, f.contents(), vtype, f.types[1] if vtype == gguf.GGUFValueType.ARRAY else None)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for t in r.tensors:
        data = gguf.quants.dequantize(t.data, t.tensor_type)
        w.add_tensor(t.name, data.astype(np.float32 if len(t.shape) == 1 else np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(dst + ".part", dst)


def chat_prompt(text: str) -> str:
    return "<start_of_turn>user\n" + text + "<end_of_turn>\n<start_of_turn>model\n"


def run(prompt: str, args: argparse.Namespace, draft: bool) -> dict:
    cmd = [args.fitllm, "run", "-m", args.target, "-p", chat_prompt(prompt), "-n", str(args.n), "--temp", "0",
           "-t", str(args.threads), "-c", "1024"]
    if draft:
        cmd += ["-md", args.draft, "--draft-max", str(args.draft_max), "--draft-p-min", str(args.draft_p_min),
                "--draft-vocab", str(args.draft_vocab)]
    p = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if p.returncode != 0:
        sys.exit(f"speculative_draft.py: {' '.join(cmd)} failed ({p.returncode}):\n{p.stderr}")
    m = SUMMARY.search(p.stderr)
    if not m:
        sys.exit(f"speculative_draft.py: no summary line in:\n{p.stderr}")
    out = {"text": p.stdout, "n_prompt": int(m.group(1)), "n_gen": int(m.group(2)), "tok_s": float(m.group(3))}
    dm, tm = DRAFTS.search(p.stderr), DRAFT_TIME.search(p.stderr)
    if dm:
        out["drafted"], out["accepted"] = int(dm.group(1)), int(dm.group(2))
    if tm:
        out["draft_seconds"], out["gen_seconds"] = float(tm.group(1)), float(tm.group(2))
    pm = PASSES.search(p.stderr)
    if pm:
        out["passes"] = int(pm.group(1))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fitllm", default=os.path.join(ROOT, "build", "fitllm"))
    ap.add_argument("--target", help="the target model (default: the demo model in F16, made under .cache/)")
    ap.add_argument("--draft", default=DEMO)
    ap.add_argument("-n", type=int, default=128, help="tokens to generate at most per prompt")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2, help="runs of each prompt and mode (alternating)")
    ap.add_argument("--draft-max", type=int, default=8)
    ap.add_argument("--draft-p-min", type=float, default=0.75)
    ap.add_argument("--draft-vocab", type=int, default=0, help="the draft scores the first N tokens only (0: all)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    if args.target is None:
        args.target = F16
        if not os.path.exists(F16):
            os.makedirs(os.path.dirname(F16), exist_ok=True)
            make_f16(DEMO, F16)

    rows, same = [], True
    print(f"target {os.path.relpath(args.target, ROOT)}, draft {os.path.relpath(args.draft, ROOT)}, "
          f"--draft-max {args.draft_max} --draft-p-min {args.draft_p_min} --draft-vocab {args.draft_vocab}, "
          f"-t {args.threads}")
    print(f"{'prompt':10} {'p tok':>6} {'gen':>5} {'plain tok/s':>12} {'-md tok/s':>10} {'ratio':>6} "
          f"{'accepted':>9} {'draft s':>8} {'checks':>7} {'check/token':>12}")
    for name, prompt in PROMPTS.items():
        plain, spec = [], []
        for _ in range(args.reps):
            plain.append(run(prompt, args, False))
            spec.append(run(prompt, args, True))
        identical = len({r["text"] for r in plain + spec}) == 1
        same &= identical
        best_plain = max(r["tok_s"] for r in plain)
        best = max(spec, key=lambda r: r["tok_s"])
        row = {"prompt": name, "n_prompt": best["n_prompt"], "n_gen": best["n_gen"], "plain_tok_s": best_plain,
               "draft_tok_s": best["tok_s"], "ratio": best["tok_s"] / best_plain,
               "drafted": best.get("drafted", 0), "accepted": best.get("accepted", 0),
               "draft_seconds": best.get("draft_seconds", 0.0), "identical": identical}
        # The target's passes (each checks one draft) and what one cost against a plain token:
        # the generation's time less the draft model's, over the passes.
        row["passes"] = best.get("passes", 0)
        if row["passes"] and "gen_seconds" in best:
            row["check_ms"] = 1000 * (best["gen_seconds"] - row["draft_seconds"]) / row["passes"]
            row["check_per_token"] = row["check_ms"] * best_plain / 1000
        rows.append(row)
        print(f"{name:10} {row['n_prompt']:6d} {row['n_gen']:5d} {best_plain:12.1f} {row['draft_tok_s']:10.1f} "
              f"{row['ratio']:5.2f}x {row['accepted']:4d}/{row['drafted']:<4d} {row['draft_seconds']:8.2f} "
              f"{row['passes']:7d} {row.get('check_per_token', 0.0):11.2f}x"
              + ("" if identical else "  TEXT DIFFERS"))
    gen = sum(r["n_gen"] for r in rows)
    t_plain = sum(r["n_gen"] / r["plain_tok_s"] for r in rows)
    t_spec = sum(r["n_gen"] / r["draft_tok_s"] for r in rows)
    print(f"{'all':10} {'':6} {gen:5d} {gen / t_plain:12.1f} {gen / t_spec:10.1f} {t_plain / t_spec:5.2f}x   "
          f"texts {'identical' if same else 'DIFFER'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "ratio": t_plain / t_spec, "identical": same}, f, indent=1)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
