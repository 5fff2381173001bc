#!/usr/bin/env bash
# Sets everything up and runs fitllm on the bundled demo model (Gemma 3 270M Q4_K_M).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup.sh"
exec "$ROOT/build/fitllm" inspect "$ROOT/models/gemma-3-270m-q4_k_m.gguf" "$@"
