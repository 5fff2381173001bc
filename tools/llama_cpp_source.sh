# Sourced by tools/build_llama_server.sh and tools/build_llama_cpp_isa.sh: sets LLAMA_CPP_VERSION
# (requirements-oracle.txt's llama-cpp-python pin) and llama_cpp_source, which fetches that
# source package once into .cache/llama-server/ and prints the directory of its vendor/llama.cpp.
# Needs network for `pip download` the first time only. Expects ROOT (the checkout).
LLAMA_CPP_VERSION="$(sed -n 's/^llama-cpp-python==\([0-9.]*\).*/\1/p' "$ROOT/requirements-oracle.txt")"
if [[ -z "$LLAMA_CPP_VERSION" ]]; then
  echo "$(basename "$0"): no llama-cpp-python==X in requirements-oracle.txt" >&2
  exit 1
fi

llama_cpp_source() {
  local cache="$ROOT/.cache/llama-server" py="$ROOT/.venv/bin/python"
  [[ -x "$py" ]] || py=python3
  mkdir -p "$cache"
  local sdist="$cache/llama_cpp_python-$LLAMA_CPP_VERSION.tar.gz" src="$cache/src-$LLAMA_CPP_VERSION"
  if [[ ! -s "$sdist" ]]; then
    echo "downloading the llama-cpp-python $LLAMA_CPP_VERSION source package" >&2
    "$py" -m pip download -q --disable-pip-version-check --no-binary llama-cpp-python --no-deps \
      -d "$cache" "llama-cpp-python==$LLAMA_CPP_VERSION" >&2
  fi
  if [[ ! -d "$src" ]]; then
    rm -rf "$src.tmp" && mkdir -p "$src.tmp"
    tar -xzf "$sdist" -C "$src.tmp" --strip-components=1
    mv "$src.tmp" "$src"
  fi
  echo "$src/vendor/llama.cpp"
}
