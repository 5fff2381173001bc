#!/usr/bin/env bash
# Sets everything up and generates text from the bundled demo model (Gemma 3 270M Q4_K_M).
#   scripts/demo.sh                         a default prompt
#   scripts/demo.sh -p "Once upon a time"   any `fitllm run` options (see build/fitllm run --help)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup.sh"
MODEL="$ROOT/models/gemma-3-270m-q4_k_m.gguf"
if [[ $# -eq 0 ]]; then
  set -- -p "The three most useful things to know about memory on a laptop are" -n 64
fi
exec "$ROOT/build/fitllm" run -m "$MODEL" "$@"
