#!/usr/bin/env bash
# Sets everything up and runs every test:
#   1. the GoogleTest suite (ctest) on the Release build,
#   2. the same suite built with AddressSanitizer + UndefinedBehaviorSanitizer,
#   3. the libFuzzer targets, each for a bounded time (FITLLM_FUZZ_SECONDS, default 30).
# Before them, every C/C++/CUDA file must be clang-formatted (scripts/check_format.sh).
# FITLLM_TEST_QUICK=1 runs step 1 only.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
JOBS="$(nproc)"
"$ROOT/scripts/setup.sh" --browser --python   # chromium for the server page test; the Python bindings
"$ROOT/scripts/check_format.sh"

PASSED=0
FAILED=0
SKIPPED=0
# Runs ctest in a build dir and adds its counts to the totals printed at the end.
run_ctest() {
  local log dir="$1"
  shift
  log="$(mktemp)"
  local junit="$ROOT/$dir/ctest-junit.xml" # absolute: ctest reads a relative one from inside $dir
  set +e
  ctest --test-dir "$dir" --output-on-failure -j "$JOBS" --output-junit "$junit" "$@" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  set -e
  python3 "$ROOT/scripts/ctest_skips.py" "$junit" || true
  local summary total failed skipped
  summary="$(grep -E 'tests passed, [0-9]+ tests failed out of [0-9]+' "$log" | tail -1)"
  skipped="$(grep -cE '\*\*\*Skipped|Not Run' "$log" || true)"
  rm -f "$log"
  total="$(sed -E 's/.* out of ([0-9]+).*/\1/' <<<"$summary")"
  failed="$(sed -E 's/.*, ([0-9]+) tests failed.*/\1/' <<<"$summary")"
  PASSED=$((PASSED + ${total:-0} - ${failed:-0} - ${skipped:-0}))
  FAILED=$((FAILED + ${failed:-0}))
  SKIPPED=$((SKIPPED + ${skipped:-0}))
  return "$rc"
}
summary() { echo "tests: $PASSED passed, $FAILED failed, $SKIPPED skipped (${SECONDS} s in all)"; }
trap summary EXIT

echo "== tests (Release) == (at ${SECONDS} s)"
run_ctest build
[[ "${FITLLM_TEST_QUICK:-0}" == 1 ]] && exit 0

echo "== tests (ASan + UBSan) == (at ${SECONDS} s)"
# Without the CUDA backend (nothing of it runs without a GPU; the Release build compiles it), and
# with line tables only for debug information (what the sanitizers' reports print; -g costs more
# compile time). Not -O1: the kernels' bit-exactness tests count on -O2's FMA contraction.
if [[ ! -f build-asan/build.ninja ]]; then
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFITLLM_SANITIZE=ON -DFITLLM_BUILD_BENCH=OFF \
    -DFITLLM_CUDA=OFF -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" >/dev/null
fi
cmake --build build-asan
# The demo model's full-size numerics (perplexity, llama.cpp's logits, PyPI's reader, long greedy
# runs with and without drafts or grammars: minutes under the sanitizers) take code paths the tiny
# models' tests take too; they run in step 1 only.
ASAN_EXCLUDED='^(Perplexity\.DemoModel|Gemma3Golden\.|DemoModel\.AgreesWithPyPIGgufReader|'
ASAN_EXCLUDED+='Lookup\.GreedyMatchesGenerateOnTheDemoModel|ChatCommand\.LookupGivesTheSameGreedyReplies|'
ASAN_EXCLUDED+='GrammarModel\.DemoModel|ModelOffload\.DemoModelSplits|DraftModel\.GreedyMatchesGenerateOnTheDemoModel|'
ASAN_EXCLUDED+='DraftModelCli\.RunAndChatGiveTheSameGreedyText|SchedulerSpecTest\.GreedyTextIsTheSameOnTheDemoModel|'
ASAN_EXCLUDED+='Avx2\.SpeculativeGreedyIdentity)'
echo "(left out under the sanitizers, run above: tests matching $ASAN_EXCLUDED)"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  run_ctest build-asan -E "$ASAN_EXCLUDED"

echo "== fuzzing (${FITLLM_FUZZ_SECONDS:-30} s a target) == (at ${SECONDS} s)"
"$ROOT/scripts/fuzz.sh" "${FITLLM_FUZZ_SECONDS:-30}"
