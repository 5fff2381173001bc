#!/usr/bin/env bash
# Builds the libFuzzer targets with clang in build-fuzz/ and runs each for SECONDS (default 60):
#   gguf_reader_fuzz     the GGUF reader and writer             seeds: fuzz/corpus/
#   jinja_fuzz           the Jinja engine: parse, check, render seeds: the chat fixtures (fuzz/make_corpus.py)
#   tokenizer_fuzz       the tokenizers of every test vocabulary seeds: llama.cpp's tokenizer test texts
#   request_parser_fuzz  the OpenAI and Ollama request parsers      seeds: fuzz/corpus_request/
# Each starts from a scratch copy of its seeds, so nothing checked in changes; as many run at a
# time as there are cores (FITLLM_FUZZ_PARALLEL=N to change). Extra arguments go to libFuzzer
# (e.g. -jobs=2, with FITLLM_FUZZ_PARALLEL=1).
#
#   scripts/fuzz.sh [SECONDS] [LIBFUZZER_ARGS...]
#
# FITLLM_FUZZ_TARGETS="jinja_fuzz tokenizer_fuzz" runs only those; FITLLM_FUZZ_KEEP=1 keeps the
# scratch directory (the grown corpora and the full logs) and prints where it is.
#
# Runs every target, then exits non-zero if any found a crash, a leak, a timeout or an
# out-of-memory; the input that triggered it is kept under fuzz/findings/TARGET/ (gitignored).
# Reproduce one with
#   build-fuzz/fuzz/TARGET fuzz/findings/TARGET/crash-...
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
seconds="${1:-60}"
shift || true
if ! [[ "$seconds" =~ ^[0-9]+$ ]]; then
    echo "usage: scripts/fuzz.sh [SECONDS] [LIBFUZZER_ARGS...]" >&2
    exit 2
fi
targets=(${FITLLM_FUZZ_TARGETS:-gguf_reader_fuzz jinja_fuzz tokenizer_fuzz request_parser_fuzz chat_output_fuzz grammar_fuzz})
cxx="${FITLLM_FUZZ_CXX:-clang++}"
build="$root/build-fuzz"

cmake -S "$root" -B "$build" -G Ninja -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DFITLLM_FUZZ=ON -DFITLLM_BUILD_TESTS=OFF -DFITLLM_BUILD_BENCH=OFF >/dev/null
ninja -C "$build" "${targets[@]}" make_seed_corpus

scratch="$(mktemp -d "${TMPDIR:-/tmp}/fitllm-fuzz-XXXXXX")"
if [ "${FITLLM_FUZZ_KEEP:-0}" = 1 ]; then
    trap 'echo "kept: $scratch (TARGET/corpus/, TARGET/fuzz.log)"' EXIT
else
    trap 'rm -rf "$scratch"' EXIT
fi

# The seeds and libFuzzer options of a target.
seed() {
    local target="$1" corpus="$2"
    case "$target" in
        gguf_reader_fuzz)
            cp "$root"/fuzz/corpus/* "$corpus/" 2>/dev/null || true
            # No checked-in seeds (a fresh checkout without them): generate them.
            [ -n "$(ls -A "$corpus")" ] || "$build/fuzz/make_seed_corpus" "$corpus" ;;
        jinja_fuzz) python3 "$root/fuzz/make_corpus.py" jinja "$corpus" >/dev/null ;;
        tokenizer_fuzz) python3 "$root/fuzz/make_corpus.py" tokenizer "$corpus" >/dev/null ;;
        request_parser_fuzz) cp "$root"/fuzz/corpus_request/* "$corpus/" ;;
    esac
}
options() {
    case "$1" in
        gguf_reader_fuzz) echo "-dict=$root/fuzz/gguf.dict -max_len=65536" ;;
        jinja_fuzz) echo "-dict=$root/fuzz/jinja.dict -max_len=16384" ;;
        tokenizer_fuzz) echo "-max_len=4096" ;;
        request_parser_fuzz) echo "-dict=$root/fuzz/request.dict -max_len=65536" ;;
        chat_output_fuzz) echo "-dict=$root/fuzz/chat_output.dict -max_len=8192" ;;
        grammar_fuzz) echo "-dict=$root/fuzz/grammar.dict -max_len=4096 -timeout=10" ;;
    esac
}

# One target: its seeds, then libFuzzer for SECONDS; its log and exit status in its scratch dir.
run_target() {
    local target="$1"
    shift
    local dir="$scratch/$target"
    mkdir -p "$dir/corpus" "$root/fuzz/findings/$target"
    seed "$target" "$dir/corpus"
    set +e
    # shellcheck disable=SC2046  # options() gives several words on purpose
    "$build/fuzz/$target" "$dir/corpus" $(options "$target") \
        -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 \
        -artifact_prefix="$root/fuzz/findings/$target/" -print_final_stats=1 "$@" >"$dir/fuzz.log" 2>&1
    echo $? >"$dir/rc"
}

# As many targets at a time as there are cores (FITLLM_FUZZ_PARALLEL; 1 when passing -jobs=N).
parallel="${FITLLM_FUZZ_PARALLEL:-$(nproc)}"
running=0
for target in "${targets[@]}"; do
    echo "=== $target: $seconds s ==="
    run_target "$target" "$@" &
    running=$((running + 1))
    if [ "$running" -ge "$parallel" ]; then
        wait -n || true
        running=$((running - 1))
    fi
done
wait

failed=()
for target in "${targets[@]}"; do
    log="$scratch/$target/fuzz.log"
    findings="$root/fuzz/findings/$target"
    rc="$(cat "$scratch/$target/rc" 2>/dev/null || echo 1)"
    echo "--- $target: final stats ---"
    grep -E '^#[0-9]+[[:space:]]+DONE|^Done [0-9]+ runs|^stat::number_of_executed_units|^stat::peak_rss_mb' "$log" ||
        tail -n 5 "$log"
    if [ "$rc" -ne 0 ]; then
        echo "--- $target: fuzzer failed (exit $rc) ---"
        grep -E 'ERROR:|SUMMARY:|invariant broken|uncaught|jinja_fuzz:|tokenizer_fuzz:|does not parse|refuses what|Test unit written' \
            "$log" | head -n 20
        cp "$log" "$findings/last-failure.log"
        echo "full log: $findings/last-failure.log"
        failed+=("$target")
    fi
done

if [ "${#failed[@]}" -ne 0 ]; then
    echo "=== findings in: ${failed[*]} (under fuzz/findings/) ==="
    exit 1
fi
echo "=== no findings: ${targets[*]} ==="
