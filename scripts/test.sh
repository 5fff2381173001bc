#!/usr/bin/env bash
# Sets everything up and runs every test:
#   1. the GoogleTest suite (ctest) on the Release build,
#   2. the same suite built with AddressSanitizer + UndefinedBehaviorSanitizer,
#   3. the GGUF reader fuzzer for a bounded time (FITLLM_FUZZ_SECONDS, default 60).
# FITLLM_TEST_QUICK=1 runs step 1 only.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
JOBS="$(nproc)"
"$ROOT/scripts/setup.sh"

echo "== tests (Release) =="
ctest --test-dir build --output-on-failure -j "$JOBS"
[[ "${FITLLM_TEST_QUICK:-0}" == 1 ]] && exit 0

echo "== tests (ASan + UBSan) =="
if [[ ! -f build-asan/build.ninja ]]; then
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFITLLM_SANITIZE=ON -DFITLLM_BUILD_BENCH=OFF >/dev/null
fi
cmake --build build-asan
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j "$JOBS"

echo "== fuzzing the GGUF reader (${FITLLM_FUZZ_SECONDS:-60} s) =="
"$ROOT/scripts/fuzz.sh" "${FITLLM_FUZZ_SECONDS:-60}"
