#!/usr/bin/env bash
# Builds llama.cpp's shared libraries (libllama, libggml*) for one x86 ISA level, from the
# llama-cpp-python source package pinned in requirements-oracle.txt (the same llama.cpp as the
# oracle), so that bench/bench_vs_llama_cpp.py --isa LEVEL compares fitllm forced to a level
# (FITLLM_CPU_ISA) with llama.cpp built for the same one on any machine that has it.
#   tools/build_llama_cpp_isa.sh LEVEL [-jN]    LEVEL: avx2 | avx512 | avx512_vnni (default -j2)
# Result: .cache/llama-cpp-LEVEL/lib/libllama.so and its libggml*.so (git-ignored). Idempotent.
# Needs network for `pip download` the first time only (tools/llama_cpp_source.sh).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LEVEL=""
JOBS="-j2"
for arg in "$@"; do
  case "$arg" in
    -j*) JOBS="$arg" ;;
    avx2 | avx512 | avx512_vnni) LEVEL="$arg" ;;
    *) echo "build_llama_cpp_isa.sh: unknown argument $arg (LEVEL: avx2, avx512, avx512_vnni)" >&2; exit 2 ;;
  esac
done
[[ -n "$LEVEL" ]] || { echo "usage: tools/build_llama_cpp_isa.sh avx2|avx512|avx512_vnni [-jN]" >&2; exit 2; }
# ggml's x86 switches per level (GGML_NATIVE=OFF: nothing beyond them).
FLAGS=(-DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON)
case "$LEVEL" in
  avx2) FLAGS+=(-DGGML_AVX512=OFF) ;;
  avx512) FLAGS+=(-DGGML_AVX512=ON) ;;
  avx512_vnni) FLAGS+=(-DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_BF16=ON) ;;
esac
# shellcheck source=tools/llama_cpp_source.sh
source "$ROOT/tools/llama_cpp_source.sh"
VERSION="$LLAMA_CPP_VERSION"
OUT="$ROOT/.cache/llama-cpp-$LEVEL"
STAMP="$OUT/lib/VERSION"
if [[ -f "$OUT/lib/libllama.so" && "$(cat "$STAMP" 2>/dev/null)" == "$VERSION" ]]; then
  echo "$OUT/lib (llama.cpp of llama-cpp-python $VERSION, $LEVEL) is built"
  exit 0
fi
LLAMA="$(llama_cpp_source)"
cmake -S "$LLAMA" -B "$OUT/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
  -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF "${FLAGS[@]}" >/dev/null
cmake --build "$OUT/build" --target llama "$JOBS"
mkdir -p "$OUT/lib"
find "$OUT/build" -name 'lib*.so*' -exec cp -P {} "$OUT/lib/" \;
echo "$VERSION" >"$STAMP"
echo "$OUT/lib (llama.cpp of llama-cpp-python $VERSION, $LEVEL) is built"
