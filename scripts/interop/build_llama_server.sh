#!/usr/bin/env bash
# Build (or reuse) a CPU-only llama-server from the llama.cpp vendored in the
# llama-cpp-python sdist (the package registry is the only network there is).
# Method as recorded with the real-engine captures (tests/data/real-engines/README.md).
# Output: $CACHE/llama-server-$VERSION/bin/llama-server (+ its shared libraries).
# Idempotent: an existing, working binary is reused; a half-built one is rebuilt.
set -euo pipefail
. "$(dirname "$0")/versions.env"
VERSION="$LLAMA_CPP_PYTHON_VERSION"
CACHE="${FLOTILLA_INTEROP_CACHE:-$HOME/.cache/flotilla/interop}"
DEST="$CACHE/llama-server-$VERSION"
JOBS="${INTEROP_JOBS:-2}"
PYTHON="${PYTHON:-python3}"

if [ -x "$DEST/bin/llama-server" ] && "$DEST/bin/llama-server" --version >/dev/null 2>&1; then
    echo "llama-server $VERSION: cached at $DEST"
    exit 0
fi

mkdir -p "$CACHE"
WORK="$CACHE/.build-llama-$VERSION"
rm -rf "$WORK" "$DEST"
mkdir -p "$WORK"
echo "llama-server $VERSION: downloading the llama-cpp-python sdist"
nice -n 19 "$PYTHON" -m pip download -q --no-deps --no-binary :all: \
    "llama-cpp-python==$VERSION" -d "$WORK"
tar -xzf "$WORK"/llama_cpp_python-"$VERSION".tar.gz -C "$WORK"
SRC="$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp"

# UI download off (it would fetch from a model hub), no CURL/OpenSSL, CPU only. Static libraries:
# one self-contained binary (a shared build's RUNPATH points into the build tree, removed below).
echo "llama-server $VERSION: building (several minutes on 2 cores)"
nice -n 19 cmake -S "$SRC" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_CUDA=OFF -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF >"$WORK/cmake.log"
nice -n 19 cmake --build "$WORK/build" --target llama-server -j "$JOBS" >"$WORK/build.log" 2>&1 \
    || { tail -n 40 "$WORK/build.log"; exit 1; }

# Keep the binary and the converter (gguf-py + script); drop the source and build trees once
# the kept binary runs on its own.
rm -rf "$DEST.tmp"
mkdir -p "$DEST.tmp/bin" "$DEST.tmp/convert"
cp -a "$WORK/build/bin/llama-server" "$DEST.tmp/bin/"
cp -a "$SRC/convert_hf_to_gguf.py" "$SRC/gguf-py" "$DEST.tmp/convert/"
[ -d "$SRC/conversion" ] && cp -a "$SRC/conversion" "$DEST.tmp/convert/" || true
mv "$DEST.tmp" "$DEST"
rm -rf "$WORK"
if ! "$DEST/bin/llama-server" --version; then
    rm -rf "$DEST"
    echo "llama-server $VERSION: the built binary does not run without its build tree" >&2
    exit 1
fi
echo "llama-server $VERSION: built at $DEST"
