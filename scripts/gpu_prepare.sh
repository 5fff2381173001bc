#!/usr/bin/env bash
# Before scripts/gpu_check.sh runs on a GPU machine that cannot reach a package registry: puts the
# Debian packages the build needs (the same as scripts/setup.sh installs, with what their pkg-config
# files require) in .gpu/debs, which gpu_check.sh unpacks under /tmp there when the machine lacks
# them. With --prebuilt, also this machine's build/fitllm and build/tests/fitllm_tests (built with
# -DFITLLM_CUDA=ON) and the shared libraries they need outside glibc, in .gpu/bin and .gpu/lib, for
# when building there fails. .gpu/ is git-ignored locally (.git/info/exclude) and travels with the
# device tool's `carry: [".gpu"]` (well under its 64 MiB).
#
#   scripts/gpu_prepare.sh [--prebuilt]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
EXCLUDE=$(git rev-parse --git-common-dir)/info/exclude
grep -qx '/.gpu/' "$EXCLUDE" 2>/dev/null || echo '/.gpu/' >>"$EXCLUDE"
mkdir -p .gpu/debs
PACKAGES=(pkgconf pkgconf-bin libpkgconf3 libpcre2-dev libpcre2-8-0 libutf8proc-dev libutf8proc2
    nlohmann-json3-dev libgtest-dev libboost-dev libboost1.74-dev)
(cd .gpu/debs && apt-get download "${PACKAGES[@]}")
echo "gpu_prepare: $(ls .gpu/debs | wc -l) packages in .gpu/debs ($(du -sh .gpu/debs | cut -f1))"

if [ "${1:-}" == "--prebuilt" ]; then
    grep -q 'FITLLM_CUDA:BOOL=ON' build/CMakeCache.txt || {
        echo "gpu_prepare: build/ is not configured with -DFITLLM_CUDA=ON" >&2
        exit 1
    }
    cmake --build build -j2 --target fitllm fitllm_tests
    mkdir -p .gpu/bin .gpu/lib
    cp build/fitllm build/tests/fitllm_tests .gpu/bin/
    ldd build/fitllm build/tests/fitllm_tests | awk '/=> \// {print $3}' | sort -u |
        grep -Ev '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*)\.so' | xargs -r cp -L -t .gpu/lib/
    echo "gpu_prepare: binaries in .gpu/bin, $(ls .gpu/lib | wc -l) libraries in .gpu/lib ($(du -sh .gpu | cut -f1) in all)"
fi
