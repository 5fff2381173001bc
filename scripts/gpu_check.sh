#!/usr/bin/env bash
# The CUDA backend's checks on a machine with an NVIDIA GPU, in one run of about 9 minutes:
#   1. configure and build with -DFITLLM_CUDA=ON (Release, -j16; sm_90 only unless GPU_ARCH is set)
#   2. the CUDA unit tests (every kernel against the CPU reference; models on cuda0 against the CPU)
#   3. greedy equality, CPU against -ngl N for several N, on the tiny test models, the demo model and
#      models/bench/llama-1b-q4_k_m.gguf (those present)
#   4. fitllm bench -p 512 -n 128 -ngl 99 on a generated 8B-shaped Llama Q4_K_M, with the bandwidth
#      roofline (model bytes per token x tokens/s against the H200's 4.8 TB/s)
# Logs go to $OUT (or gpu-check-logs/); summary.txt there says what passed, failed or was skipped.
# GPU_FLAGS: more flags for `run` and `bench` to put layers on the GPU (e.g. "--device cuda0");
# MODEL8B: where the 8B model is (generated there when missing); GPU_ARCH: CMAKE_CUDA_ARCHITECTURES.
#
#   scripts/gpu_prepare.sh         # here, before: Debian packages the build needs, into .gpu/
#   scripts/gpu_check.sh           # there (device tool: command "bash scripts/gpu_check.sh", carry [".gpu"])
#
# Build dependencies: those found on the machine, else the Debian packages scripts/gpu_prepare.sh
# put in .gpu/debs (unpacked under /tmp, never over /). If the build there fails and .gpu/bin holds
# binaries built elsewhere (gpu_prepare.sh --prebuilt), those run instead.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
LOG=${OUT:-$ROOT/gpu-check-logs}
mkdir -p "$LOG"
SUMMARY=$LOG/summary.txt
: >"$SUMMARY"
START=$(date +%s)
BUDGET_S=${GPU_CHECK_BUDGET_S:-540}
say() { echo "[gpu_check $(($(date +%s) - START))s] $*" | tee -a "$SUMMARY"; }
left() { echo $((BUDGET_S - ($(date +%s) - START))); }

# Runs a step with a time limit (seconds, capped by what is left), its output in $LOG/NAME.log.
step() {
    local name=$1 limit=$2
    shift 2
    local l
    l=$(left)
    ((limit > l)) && limit=$l
    if ((limit < 10)); then
        say "SKIP $name: out of time"
        return 1
    fi
    timeout "$limit" "$@" >"$LOG/$name.log" 2>&1
    local rc=$?
    if ((rc == 0)); then say "PASS $name"; else say "FAIL $name (exit $rc; tail of $name.log below)"; tail -n 15 "$LOG/$name.log" | tee -a "$SUMMARY"; fi
    return $rc
}

command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
{
    nvidia-smi || true
    nvcc --version || true
    g++ --version | head -1 || true
    cmake --version | head -1 || true
    ninja --version || true
    uname -a
    nproc
} >"$LOG/env.log" 2>&1
say "GPU: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo none)"

# ---- 1. Build ------------------------------------------------------------------------------------
DEPS=/tmp/fitllm-deps
if ls .gpu/debs/*.deb >/dev/null 2>&1 && { ! pkg-config --exists libpcre2-8 libutf8proc 2>/dev/null || [ ! -f /usr/include/boost/beast.hpp ]; }; then
    mkdir -p "$DEPS"
    for f in .gpu/debs/*.deb; do dpkg -x "$f" "$DEPS"; done
    # The packages' .pc files say prefix=/usr: point them at the unpacked tree.
    find "$DEPS" -name '*.pc' -exec sed -i "s|^prefix=/usr|prefix=$DEPS/usr|" {} +
    export PATH=$DEPS/usr/bin:$PATH
    export PKG_CONFIG_PATH=$DEPS/usr/lib/x86_64-linux-gnu/pkgconfig:$DEPS/usr/share/pkgconfig:${PKG_CONFIG_PATH:-}
    export CMAKE_PREFIX_PATH=$DEPS/usr:${CMAKE_PREFIX_PATH:-}
    export LD_LIBRARY_PATH=$DEPS/usr/lib/x86_64-linux-gnu:$DEPS/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
    say "build dependencies from .gpu/debs, unpacked in $DEPS"
fi
BUILD=${GPU_CHECK_BUILD:-build-gpu}  # GPU_CHECK_BUILD=build: an existing build (ninja brings it up to date)
FITLLM=$BUILD/fitllm
TESTS=$BUILD/tests/fitllm_tests
if [ -n "${GPU_CHECK_BUILD:-}" ] && step build 300 ninja -C "$BUILD" fitllm fitllm_tests; then
    :
elif step configure 120 cmake -S . -B $BUILD -G Ninja -DCMAKE_BUILD_TYPE=Release -DFITLLM_CUDA=ON \
    -DFITLLM_BUILD_BENCH=OFF "-DCMAKE_CUDA_ARCHITECTURES=${GPU_ARCH:-90}" &&
    step build 300 ninja -C $BUILD -j16 fitllm fitllm_tests; then
    grep -E "^\[[0-9]+/[0-9]+\]" "$LOG/build.log" | tail -1 >>"$SUMMARY"
elif [ -x .gpu/bin/fitllm ]; then
    FITLLM=.gpu/bin/fitllm
    TESTS=.gpu/bin/fitllm_tests
    export LD_LIBRARY_PATH=$ROOT/.gpu/lib:${LD_LIBRARY_PATH:-}
    say "the build failed: running the binaries of .gpu/bin instead"
else
    say "no fitllm to run: stopping"
    exit 1
fi

# ---- 2. Unit tests -------------------------------------------------------------------------------
step cuda_unit_tests 180 "$TESTS" --gtest_filter='Cuda*' --gtest_color=no
grep -E "^\[  (PASSED|FAILED|SKIPPED) " "$LOG/cuda_unit_tests.log" | head -30 | tee -a "$SUMMARY"

# ---- 3. Greedy equality through the command line -------------------------------------------------
# GPU_FLAGS: anything else the command line needs to put layers on the GPU (e.g. "--device cuda0").
GPU_FLAGS=${GPU_FLAGS:-}
if "$FITLLM" run --help 2>&1 | grep -q -- '-ngl'; then
    greedy() {  # MODEL NGL...: the same 48 greedy tokens on the CPU and with each -ngl
        local model=$1 base
        shift
        base=$("$FITLLM" run -m "$model" -p "The quick brown fox" -n 48 --temp 0 -ngl 0 2>>"$LOG/greedy_stderr.log") ||
            return 1
        for n in "$@"; do
            local got
            got=$("$FITLLM" run -m "$model" -p "The quick brown fox" -n 48 --temp 0 -ngl "$n" $GPU_FLAGS 2>>"$LOG/greedy_stderr.log") ||
                return 1
            if [ "$got" == "$base" ]; then
                echo "$model -ngl $n: same text as the CPU"
            else
                echo "$model -ngl $n: DIFFERS from the CPU"
                echo "  cpu: $base"
                echo "  gpu: $got"
                return 1
            fi
        done
    }
    for m in tests/model/data/tiny-llama-q4_k_m.gguf tests/model/data/tiny-qwen2-q4_k_m.gguf \
        tests/model/data/tiny-llama-q8_0.gguf models/gemma-3-270m-q4_k_m.gguf models/bench/llama-1b-q4_k_m.gguf; do
        [ -f "$m" ] || { say "SKIP greedy $m: not here"; continue; }
        step "greedy_$(basename "$m" .gguf)" 90 greedy "$m" 1 2 99
        tee -a "$SUMMARY" <"$LOG/greedy_$(basename "$m" .gguf).log"
    done
else
    say "SKIP greedy equality and bench -ngl: this fitllm's run has no -ngl (not wired yet)"
fi

# ---- 4. 8B Q4_K_M bench with the roofline --------------------------------------------------------
MODEL8B=${MODEL8B:-/tmp/fitllm-models/llama-8b-q4_k_m.gguf}
mkdir -p "$(dirname "$MODEL8B")"
PY=python3
[ -x .venv/bin/python ] && .venv/bin/python -c 'import numpy' 2>/dev/null && PY=.venv/bin/python
[ -f "$MODEL8B" ] || step gen_8b_model 150 $PY tools/gen_q4km_bench_model.py "$MODEL8B"
if [ -f "$MODEL8B" ] && "$FITLLM" bench --help 2>&1 | grep -q -- '-ngl'; then
    if step bench_8b 200 "$FITLLM" bench -m "$MODEL8B" -p 512 -n 128 -r 3 -ngl 99 $GPU_FLAGS -o json; then
        cat "$LOG/bench_8b.log" >>"$SUMMARY"
        $PY - "$LOG/bench_8b.log" <<'EOF' | tee -a "$SUMMARY"
import json, sys
text = open(sys.argv[1]).read()
results = json.loads(text[text.index("["):text.rindex("]") + 1]) if "[" in text else []
# Bytes a decoded token reads: every weight but the embedding table, of which one row is read
# (tools/gen_q4km_bench_model.py: 128256 x 4096 in Q4_K); the KV cache adds < 1% at 640 tokens.
EMBD = 128256 * 4096 // 256 * 144
for r in results:
    name, tps = r["test"], float(r["avg_ts"])
    if name.startswith("tg"):
        per_token = int(r["weight_bytes"]) - EMBD
        bw = per_token * tps
        print(f"roofline {name}: {tps:.1f} tok/s x {per_token / 1e9:.2f} GB per token = {bw / 1e12:.2f} TB/s, "
              f"{100 * bw / 4.8e12:.0f}% of the H200's 4.8 TB/s (bound: {4.8e12 / per_token:.0f} tok/s)")
    else:
        print(f"{name}: {tps:.1f} tok/s (+- {float(r['stddev_ts']):.1f})")
if not results:
    print("roofline: no JSON results in bench_8b.log; see it")
EOF
    fi
elif [ -f "$MODEL8B" ]; then
    say "SKIP bench_8b: this fitllm's bench has no -ngl (not wired yet)"
fi
say "done in $(($(date +%s) - START)) s; logs in $LOG"
