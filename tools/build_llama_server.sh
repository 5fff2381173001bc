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
VERSION="$(sed -n 's/^llama-cpp-python==\([0-9.]*\).*/\1/p' "$ROOT/requirements-oracle.txt")"
[[ -n "$VERSION" ]] || { echo "build_llama_server.sh: no llama-cpp-python==X in requirements-oracle.txt" >&2; exit 1; }
CACHE="$ROOT/.cache/llama-server"
BIN="$CACHE/bin/llama-server"
STAMP="$CACHE/bin/VERSION"
if [[ -x "$BIN" && "$(cat "$STAMP" 2>/dev/null)" == "$VERSION" ]]; then
  echo "$BIN (llama-cpp-python $VERSION) is built"
  exit 0
fi
mkdir -p "$CACHE"
PY="$ROOT/.venv/bin/python"; [[ -x "$PY" ]] || PY=python3
SDIST="$CACHE/llama_cpp_python-$VERSION.tar.gz"
if [[ ! -s "$SDIST" ]]; then
  echo "downloading the llama-cpp-python $VERSION source package"
  "$PY" -m pip download -q --disable-pip-version-check --no-binary llama-cpp-python --no-deps \
    -d "$CACHE" "llama-cpp-python==$VERSION"
fi
SRC="$CACHE/src-$VERSION"
if [[ ! -d "$SRC" ]]; then
  rm -rf "$SRC.tmp" && mkdir -p "$SRC.tmp"
  tar -xzf "$SDIST" -C "$SRC.tmp" --strip-components=1
  mv "$SRC.tmp" "$SRC"
fi
LLAMA="$SRC/vendor/llama.cpp"
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
