#!/usr/bin/env bash
# Installs a build into a temporary prefix, builds examples/c (pkg-config) and examples/cpp
# (find_package) against it as outside projects, and checks that each prints the same greedy text
# as the installed `fitllm run`, then runs examples/server/tool_call.py against the installed
# `fitllm serve` (a forced tool call, its arguments checked against the function's schema; skipped,
# saying so, without Python's openai and jsonschema). ctest runs it as InstalledExamples.
#   scripts/test_examples.sh [BUILD_DIR] [MODEL]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:-$ROOT/build}"
MODEL="${2:-$ROOT/models/gemma-3-270m-q4_k_m.gguf}"
[[ -f "$MODEL" ]] || MODEL="$ROOT/tests/model/data/tiny-llama-q8_0.gguf"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/fitllm-examples-XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
prefix="$tmp/prefix"

cmake --install "$BUILD" --prefix "$prefix" >/dev/null
libdir="$(dirname "$(find "$prefix" -name 'libfitllm.so' | head -n 1)")"
PKG_CONFIG_PATH="$libdir/pkgconfig" cmake -S "$ROOT/examples/c" -B "$tmp/c" -G Ninja >/dev/null
cmake --build "$tmp/c" >/dev/null
cmake -S "$ROOT/examples/cpp" -B "$tmp/cpp" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$tmp/cpp" >/dev/null

prompt="The capital of France is"
expected="$("$prefix/bin/fitllm" run -m "$MODEL" -p "$prompt" -n 24 --temp 0 -c 512 2>/dev/null)"
passed=0
failed=0
for example in c cpp; do
  got="$("$tmp/$example/generate" "$MODEL" "$prompt" 24)"
  if [[ "$got" == "$expected" ]]; then
    echo "examples/$example: the same text as fitllm run ($(basename "$MODEL"))"
    passed=$((passed + 1))
  else
    echo "examples/$example: differs from fitllm run"
    diff <(echo "$expected") <(echo "$got") || true
    failed=$((failed + 1))
  fi
done
python="${FITLLM_PYTHON:-$ROOT/.venv/bin/python}"
[[ -x "$python" ]] || python="$(command -v python3 || true)"
if [[ -n "$python" ]] && "$python" -c 'import openai, jsonschema' 2>/dev/null; then
  if "$python" "$ROOT/examples/server/tool_call.py" --fitllm "$prefix/bin/fitllm" --model "$MODEL"; then
    echo "examples/server/tool_call.py: valid tool calls ($(basename "$MODEL"))"
    passed=$((passed + 1))
  else
    echo "examples/server/tool_call.py: failed"
    failed=$((failed + 1))
  fi
else
  echo "examples/server/tool_call.py: skipped (needs Python with openai and jsonschema: scripts/setup.sh --python)"
fi
echo "examples: $passed passed, $failed failed"
((failed == 0))
