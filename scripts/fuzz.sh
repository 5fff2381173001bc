#!/usr/bin/env bash
# Builds the libFuzzer targets with clang in build-fuzz/ and fuzzes the GGUF reader, then the
# OpenAI request parser, for SECONDS (default 60) each, starting from scratch copies of
# fuzz/corpus/ and fuzz/corpus_request/ so the checked-in seeds stay as they are. Extra arguments
# go to libFuzzer (e.g. -jobs=2).
#
#   scripts/fuzz.sh [SECONDS] [LIBFUZZER_ARGS...]
#
# FITLLM_FUZZ_KEEP=1 keeps the scratch directory (the grown corpus and the full log) and prints
# where it is.
#
# Exits non-zero when the fuzzer finds a crash, a leak, a timeout or an out-of-memory; the
# input that triggered it is kept under fuzz/findings/ (gitignored). Reproduce one with
#   build-fuzz/fuzz/gguf_reader_fuzz fuzz/findings/crash-...
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
seconds="${1:-60}"
shift || true
if ! [[ "$seconds" =~ ^[0-9]+$ ]]; then
    echo "usage: scripts/fuzz.sh [SECONDS] [LIBFUZZER_ARGS...]" >&2
    exit 2
fi
cxx="${FITLLM_FUZZ_CXX:-clang++}"
build="$root/build-fuzz"

cmake -S "$root" -B "$build" -G Ninja -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DFITLLM_FUZZ=ON -DFITLLM_BUILD_TESTS=OFF -DFITLLM_BUILD_BENCH=OFF >/dev/null
ninja -C "$build" gguf_reader_fuzz make_seed_corpus request_parser_fuzz

scratch="$(mktemp -d "${TMPDIR:-/tmp}/fitllm-fuzz-XXXXXX")"
if [ "${FITLLM_FUZZ_KEEP:-0}" = 1 ]; then
    trap 'echo "kept: $scratch (corpus/, fuzz.log)"' EXIT
else
    trap 'rm -rf "$scratch"' EXIT
fi
mkdir -p "$scratch/corpus" "$root/fuzz/findings"
cp "$root"/fuzz/corpus/* "$scratch/corpus/" 2>/dev/null || true
if [ -z "$(ls -A "$scratch/corpus")" ]; then
    # No checked-in seeds (a fresh checkout without them): generate them.
    "$build/fuzz/make_seed_corpus" "$scratch/corpus"
fi

log="$scratch/fuzz.log"
set +e
"$build/fuzz/gguf_reader_fuzz" "$scratch/corpus" \
    -dict="$root/fuzz/gguf.dict" \
    -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=2048 -timeout=10 \
    -artifact_prefix="$root/fuzz/findings/" -print_final_stats=1 "$@" 2>&1 | tee "$log" |
    grep -E '^#[0-9]+[[:space:]]+(INITED|pulse)' --line-buffered
rc=${PIPESTATUS[0]}
set -e

echo "--- final stats ---"
grep -E '^#[0-9]+[[:space:]]+DONE|^Done [0-9]+ runs|^stat::' "$log" || tail -n 5 "$log"
if [ "$rc" -ne 0 ]; then
    echo "--- fuzzer failed (exit $rc) ---"
    grep -E 'ERROR:|SUMMARY:|invariant broken|does not parse|refuses what|Test unit written' "$log" | head -n 20
    echo "full log: $root/fuzz/findings/last-failure.log"
    cp "$log" "$root/fuzz/findings/last-failure.log"
    exit "$rc"
fi

# Then the OpenAI request parser (fuzz/request_parser_fuzz.cpp) for as long, from fuzz/corpus_request/.
mkdir -p "$scratch/corpus_request"
cp "$root"/fuzz/corpus_request/* "$scratch/corpus_request/"
log="$scratch/fuzz_request.log"
set +e
"$build/fuzz/request_parser_fuzz" "$scratch/corpus_request" -dict="$root/fuzz/request.dict" \
    -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=2048 -timeout=10 \
    -artifact_prefix="$root/fuzz/findings/" -print_final_stats=1 "$@" 2>&1 | tee "$log" |
    grep -E '^#[0-9]+[[:space:]]+(INITED|pulse)' --line-buffered
rc=${PIPESTATUS[0]}
set -e
echo "--- final stats (request parser) ---"
grep -E '^#[0-9]+[[:space:]]+DONE|^Done [0-9]+ runs|^stat::' "$log" || tail -n 5 "$log"
if [ "$rc" -ne 0 ]; then
    echo "--- request parser fuzzer failed (exit $rc) ---"
    grep -E 'ERROR:|SUMMARY:|invariant broken|uncaught|Test unit written' "$log" | head -n 20
    cp "$log" "$root/fuzz/findings/last-failure.log"
    exit "$rc"
fi
