#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` (the baseline for bench/server_load.py) from the
# llama-cpp-python source package pinned in requirements-oracle.txt: its vendor/llama.cpp carries
# tools/server. Result: .cache/llama-server/bin/llama-server (git-ignored). Idempotent.
#   tools/build_llama_server.sh [-jN]      (default -j2: the build machine is shared)
# Needs network for `pip download` the first time only; the sdist is kept in the cache.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
JOBS="-j2"
for arg in "$@"; do
  case "$arg" in
    -j*) JOBS="$arg" ;;
    *) echo "build_llama_server.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done
# shellcheck source=tools/llama_cpp_source.sh
source "$ROOT/tools/llama_cpp_source.sh"
VERSION="$LLAMA_CPP_VERSION"
CACHE="$ROOT/.cache/llama-server"
BIN="$CACHE/bin/llama-server"
STAMP="$CACHE/bin/VERSION"
if [[ -x "$BIN" && "$(cat "$STAMP" 2>/dev/null)" == "$VERSION" ]]; then
  echo "$BIN (llama-cpp-python $VERSION) is built"
  exit 0
fi
LLAMA="$(llama_cpp_source)"
if [[ ! -f "$LLAMA/tools/server/CMakeLists.txt" ]]; then
  echo "build_llama_server.sh: $LLAMA/tools/server is missing from the source package" >&2
  exit 1
fi
cmake -S "$LLAMA" -B "$CACHE/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF >/dev/null
cmake --build "$CACHE/build" --target llama-server "$JOBS"
mkdir -p "$CACHE/bin"
cp "$CACHE/build/bin/llama-server" "$BIN"
echo "$VERSION" >"$STAMP"
echo "$BIN (llama-cpp-python $VERSION) is built"
