#!/usr/bin/env python3
"""Speculative decoding by prompt lookup (`fitllm run --lookup`), measured (issue 23): the demo
model (Gemma 3 270M Q4_K_M) on an edit / summarise / code-refactor prompt set, greedy, each prompt
with and without --lookup (alternating, --reps times each). The texts must be identical (exit
status 1 otherwise); the decode speed of each run is the `generated: N tokens, X tok/s` of run's
summary line (from the first generated token to the last, prompt excluded).

  .venv/bin/python bench/speculative.py [--fitllm build/fitllm] [-n 256] [-t 2] [--reps 2]
                                        [--draft-max 10] [--one-token-order] [--json out.json]

A draft pass multiplies several tokens at once in the arithmetic of one-token passes
(model::Batch::token_order), so the texts are the same with the default kernels.
--one-token-order also runs the prompts in that order (FITLLM_NO_BATCH_ORDER=1 for both modes).

Reported per prompt: its tokens, the tokens generated, decode tok/s without and with lookup (the
best of the reps, the least disturbed on a shared machine), their ratio, and lookup's acceptance;
then the set's ratio of total decode time.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "models", "gemma-3-270m-q4_k_m.gguf")

PARAGRAPH = (
    "The commitee met on tuesday to discus the new budjet for the libary. Several members argued that "
    "the current funding was not enough to keep the building open on weekends, and they proposed a "
    "small increase in the anual fee. Others were worried that a higher fee would discourage families "
    "from joining. After a long debate, the commitee agreed to postpone the decision untill the next "
    "meeting, when more information about the costs would be available."
)

ARTICLE = (
    "Researchers at the coastal institute have spent three years tracking the migration of grey whales "
    "along the Pacific coast. Using small satellite tags attached to forty adult whales, the team "
    "recorded the animals' positions every few hours. The data show that the whales now leave their "
    "feeding grounds in the Arctic about two weeks later than they did in the 1990s, and that they "
    "travel closer to the shore than expected. The scientists believe that warmer water and changes in "
    "the amount of food available are the main reasons. They warn that whales swimming close to the "
    "coast are more likely to be struck by ships or caught in fishing gear, and they recommend new "
    "speed limits for large vessels during the migration season."
)

CODE = '''def process(data):
    result = []
    for i in range(len(data)):
        item = data[i]
        if item["active"] == True:
            name = item["name"].strip().lower()
            score = item["score"] * 2 + 10
            result.append({"name": name, "score": score})
    total = 0
    for r in result:
        total = total + r["score"]
    return result, total
'''

CODE2 = '''class Inventory:
    def __init__(self):
        self.items = {}

    def add(self, name, count):
        if name in self.items:
            self.items[name] = self.items[name] + count
        else:
            self.items[name] = count

    def remove(self, name, count):
        if name in self.items:
            self.items[name] = self.items[name] - count
            if self.items[name] <= 0:
                del self.items[name]

    def report(self):
        for name in self.items:
            print(name + ": " + str(self.items[name]))
'''

PROMPTS = {
    "edit-spelling": "Correct the spelling mistakes in this paragraph. Reply with the corrected paragraph "
    "only.\n\n" + PARAGRAPH,
    "edit-tense": "Rewrite this paragraph in the present tense, changing nothing else.\n\n" + PARAGRAPH,
    "summarise": "Summarise this article in a few sentences.\n\n" + ARTICLE,
    "summarise-points": "List the main facts of this article as bullet points.\n\n" + ARTICLE,
    "refactor-rename": "Rename the function `process` to `collect_active` and the variable `result` to "
    "`entries` in this Python code. Reply with the whole code.\n\n```python\n" + CODE + "```",
    "refactor-class": "Add type hints to every method of this Python class. Reply with the whole class.\n\n"
    "```python\n" + CODE2 + "```",
}

SUMMARY = re.compile(r"prompt: (\d+) tokens, [\d.]+ tok/s \| generated: (\d+) tokens, ([\d.]+) tok/s")
LOOKUP = re.compile(r"lookup: (\d+) drafted, (\d+) accepted")


def chat_prompt(text: str) -> str:
    return "<start_of_turn>user\n" + text + "<end_of_turn>\n<start_of_turn>model\n"


def run(fitllm: str, prompt: str, args: argparse.Namespace, lookup: bool) -> dict:
    cmd = [fitllm, "run", "-m", args.model, "-p", chat_prompt(prompt), "-n", str(args.n), "--temp", "0",
           "-t", str(args.threads), "-c", "2048"]
    if lookup:
        cmd += ["--lookup", "--draft-max", str(args.draft_max)]
    env = dict(os.environ)
    if args.one_token_order:
        env["FITLLM_NO_BATCH_ORDER"] = "1"
    p = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if p.returncode != 0:
        sys.exit(f"speculative.py: {' '.join(cmd[:3])} ... failed ({p.returncode}):\n{p.stderr}")
    m = SUMMARY.search(p.stderr)
    if not m:
        sys.exit(f"speculative.py: no summary line in:\n{p.stderr}")
    out = {"text": p.stdout, "n_prompt": int(m.group(1)), "n_gen": int(m.group(2)), "tok_s": float(m.group(3))}
    lm = LOOKUP.search(p.stderr)
    if lm:
        out["drafted"], out["accepted"] = int(lm.group(1)), int(lm.group(2))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fitllm", default=os.path.join(ROOT, "build", "fitllm"))
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("-n", type=int, default=256, help="tokens to generate at most per prompt")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2, help="runs of each prompt and mode (alternating)")
    ap.add_argument("--draft-max", type=int, default=10)
    ap.add_argument("--one-token-order", action="store_true",
                    help="FITLLM_NO_BATCH_ORDER=1 for both modes: every pass in the one-token float order")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()

    rows, same = [], True
    print(f"{'prompt':18} {'p tok':>6} {'gen':>5} {'plain tok/s':>12} {'lookup tok/s':>13} {'ratio':>6} "
          f"{'accepted':>9}")
    for name, prompt in PROMPTS.items():
        plain, spec = [], []
        for _ in range(args.reps):
            plain.append(run(args.fitllm, prompt, args, False))
            spec.append(run(args.fitllm, prompt, args, True))
        texts = {r["text"] for r in plain + spec}
        identical = len(texts) == 1
        # Where a text first differs from the first plain run's, in characters after the prompt.
        base = plain[0]["text"]
        start = len(chat_prompt(prompt))
        first_diff = min((next((i for i, (a, b) in enumerate(zip(base, r["text"])) if a != b),
                               min(len(base), len(r["text"]))) for r in plain + spec if r["text"] != base),
                         default=None)
        same &= identical
        best_plain = max(r["tok_s"] for r in plain)
        best_spec = max(r["tok_s"] for r in spec)
        s = spec[0]
        acc = s["accepted"] / s["drafted"] if s.get("drafted") else 0.0
        row = {"prompt": name, "n_prompt": s["n_prompt"], "n_gen": s["n_gen"], "plain_tok_s": best_plain,
               "lookup_tok_s": best_spec, "ratio": best_spec / best_plain, "drafted": s.get("drafted", 0),
               "accepted": s.get("accepted", 0), "identical": identical,
               "differs_at_char": None if first_diff is None else first_diff - start,
               "generated_chars": len(base) - start}
        rows.append(row)
        print(f"{name:18} {row['n_prompt']:6d} {row['n_gen']:5d} {best_plain:12.1f} {best_spec:13.1f} "
              f"{row['ratio']:5.2f}x {row['accepted']:4d}/{row['drafted']:<4d}"
              + ("" if identical else f"  text differs from char {row['differs_at_char']} of {row['generated_chars']}"))
    # The set: total generated tokens over total decode time, each mode.
    gen = sum(r["n_gen"] for r in rows)
    t_plain = sum(r["n_gen"] / r["plain_tok_s"] for r in rows)
    t_spec = sum(r["n_gen"] / r["lookup_tok_s"] for r in rows)
    print(f"{'all':18} {'':6} {gen:5d} {gen / t_plain:12.1f} {gen / t_spec:13.1f} {t_plain / t_spec:5.2f}x   "
          f"texts {'identical' if same else 'DIFFER'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "ratio": t_plain / t_spec, "identical": same}, f, indent=1)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
